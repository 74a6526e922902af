"""Can this storage feed the accelerators? Emulated accelerators over the suite's real input path
(accelerators.py: the rates and the config section; emulate.py: the strategy an emulated run trains with;
page_cache.py: keeping a dataset out of the page cache between epochs). docs/storage.md."""

#!/bin/bash
#PJM -N {{ name }}
#PJM -L "node={{ nodes }}"
#PJM -L "elapse={{ time }}"
#PJM --mpi "max-proc-per-node={{ ranks_per_node }}"
#PJM -j
#PJM -s

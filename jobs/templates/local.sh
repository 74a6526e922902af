#!/bin/bash
# A job for this host only (no scheduler): run it with bash.

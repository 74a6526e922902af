#!/bin/bash
#BSUB -J {{ name }}
#BSUB -nnodes {{ nodes }}
#BSUB -W {{ time_minutes }}
#BSUB -o {{ name }}-%J.out

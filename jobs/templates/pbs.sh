#!/bin/bash
#PBS -N {{ name }}
#PBS -l select={{ nodes }}:ncpus={{ cores_per_node }}
#PBS -l walltime={{ time }}
#PBS -j oe
#PBS -o {{ name }}.out

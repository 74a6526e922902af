#!/bin/bash
#$ -N {{ name }}
#$ -l {{ node_type }}={{ nodes }}
#$ -l h_rt={{ time }}
#$ -cwd
#$ -j y
#$ -S /bin/bash

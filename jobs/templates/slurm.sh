#!/bin/bash
#SBATCH --job-name={{ name }}
#SBATCH --nodes={{ nodes }}
#SBATCH --ntasks-per-node={{ ranks_per_node }}
#SBATCH --cpus-per-task={{ cpus_per_rank }}
#SBATCH --time={{ time }}
#SBATCH --output={{ name }}-%j.out

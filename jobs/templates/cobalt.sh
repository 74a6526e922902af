#!/bin/bash
#COBALT --jobname {{ name }}
#COBALT -n {{ nodes }}
#COBALT -t {{ time_minutes }}

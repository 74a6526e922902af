"""`python -m common.campaign run|score ...`: the campaign command (common/campaign/run.py)."""
import sys

from common.campaign.run import main

if __name__ == "__main__":
    sys.exit(main())

"""Checks one candidate with pvf_lmeval.sandbox and prints the ExecResult as JSON.

tests/test_sandbox_attacks.py starts this as a plain (unprivileged) user, so that the
sandbox is exercised the way a non-root user runs it. argv[1]: a JSON object with the
keyword arguments of check_candidate (``program`` included).
"""

import dataclasses
import json
import sys

from pvf_lmeval.sandbox import check_candidate


def main() -> None:
    job = json.loads(sys.argv[1])
    result = check_candidate(job.pop("program"), **job)
    print(json.dumps(dataclasses.asdict(result)), flush=True)


if __name__ == "__main__":
    main()

"""`hbpe train --json` prints the result alone on stdout, on one process or several: Composer's launcher
and its ranks write their lines to stderr (the launcher's "Waiting up to 30 seconds..." line
and rank 0's config dump came before it on stdout; rank 0 now prints a progress line there, and json.loads(stdout) failed).

The run is the shared `sharded_run` (conftest): `hbpe train --nproc 2 --json` with FSDP2, as a user types it.
"""

from __future__ import annotations

import json


def test_train_json_on_two_processes_is_json_alone(sharded_run):
    assert sharded_run.stdout.startswith("{"), sharded_run.stdout[:2000]
    result = json.loads(sharded_run.stdout)  # the whole of stdout: nothing before or after the result
    assert result["world_size"] == 2 and result["batches"] == 2
    assert result["save_folder"] == str(sharded_run.folder)
    assert result["eval"]["BitsPerByte"] > 0  # evaluated under FSDP2 on both ranks
    # rank 0 hands the result to the launching command in a file (HBPE_RESULT_FILE), not as a printed line
    assert "HBPE_RESULT" not in sharded_run.stdout + sharded_run.stderr
    # what the launcher and rank 0 print (rank 0's progress line, the launcher's cleanup line) is on stderr
    assert "Waiting up to 30 seconds for all training processes to terminate" in sharded_run.stderr
    assert "train: " in sharded_run.stderr and "batches" in sharded_run.stderr

"""An error raised in a DataLoader worker process reaches the user as its own one line, not torch's traceback text."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
import torch

from hbpe.schemas.errors import ArtifactError, internal_error_line, user_message

MESSAGE = "shard shard.00003.mds: 3 bytes where the index says 4096; delete the cached copy and rerun"


class _BadShard(torch.utils.data.Dataset):
    def __len__(self) -> int:
        return 4

    def __getitem__(self, i: int) -> int:
        if i == 2:
            try:
                raise OSError("short read")
            except OSError as e:  # a chained cause: torch's text then holds two tracebacks
                raise ArtifactError(MESSAGE) from e
        return i


def _worker_error(dataset: torch.utils.data.Dataset) -> BaseException:
    loader = torch.utils.data.DataLoader(dataset, batch_size=1, num_workers=1)
    with pytest.raises(Exception) as caught:
        list(loader)
    return caught.value


def test_a_workers_hbpe_error_is_its_message_and_the_worker():
    e = _worker_error(_BadShard())
    assert isinstance(e, ArtifactError)
    assert "Traceback" in str(e)  # torch's re-raise: the worker's whole traceback is the message
    assert user_message(e) == f"{MESSAGE} (raised in DataLoader worker process 0)"


def test_a_workers_unexpected_error_is_one_internal_error_line():
    class _Bug(_BadShard):
        def __getitem__(self, i: int) -> int:
            return {}["missing"] if i == 1 else i

    line = internal_error_line(_worker_error(_Bug()))
    assert line.startswith("error: internal error: KeyError: 'missing' (raised in DataLoader worker process 0)")
    assert "Traceback" not in line and "\n" not in line


def test_an_error_of_the_process_itself_is_left_as_it_is():
    assert user_message(ArtifactError("a\n  b")) == "a b"
    assert user_message(ValueError("Caught nothing here")) == "Caught nothing here"


def test_the_cli_prints_a_workers_error_as_one_line(tmp_path):
    script = tmp_path / "cli.py"
    script.write_text(
        textwrap.dedent(f"""
        import torch
        from hbpe.cli.common import Group
        from hbpe.schemas.errors import ArtifactError

        class Bad(torch.utils.data.Dataset):
            def __len__(self):
                return 2
            def __getitem__(self, i):
                raise ArtifactError({MESSAGE!r})

        group = Group()

        @group.command()
        def read():
            list(torch.utils.data.DataLoader(Bad(), num_workers=1))

        group(["read"])
    """)
    )
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines()[-1] == f"error: {MESSAGE} (raised in DataLoader worker process 0)"
    assert "Traceback" not in done.stderr


def test_a_workers_error_without_a_message_is_its_type_and_the_worker():
    """A bare `assert` or `raise NotImplementedError` in a worker: no `T: message` line ends torch's text."""

    class _Bare(_BadShard):
        def __getitem__(self, i: int) -> int:
            raise NotImplementedError

    e = _worker_error(_Bare())
    assert user_message(e) == "(raised in DataLoader worker process 0)"
    line = internal_error_line(e)
    assert line.startswith("error: internal error: NotImplementedError: (raised in DataLoader worker process 0) (rerun")
    assert "Traceback" not in line

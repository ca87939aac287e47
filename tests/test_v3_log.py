"""Format v3's versioned log without Spark (docs/design/format-v3.md, landing step 1): the commit
codec, the fold into the state and the rules of sections 8 and 10, and the log on local disk
under lost answers, races and a recreated lake."""

from __future__ import annotations

import json
import threading
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from lakesink.commit.versions import RetryPolicy, VersionedLogWriter
from lakesink_reader.errors import (
    CommitConflictError,
    CommitError,
    CommitRefusedError,
    CommitStateUnknownError,
    CorruptFileError,
    FormatVersionError,
)
from lakesink_reader.format.v3.commits import (
    MIB,
    AddFile,
    Commit,
    Continuation,
    PendingCommit,
    RemoveFile,
    decode_commit,
    decode_header,
    encode_commit,
    new_op_token,
    writer_tag,
)
from lakesink_reader.format.v3.logfiles import LOG_DIR, commit_name, parse_commit_name
from lakesink_reader.format.v3.state import (
    LiveFiles,
    TableState,
    check_append,
    check_compaction,
    continuation_problems,
    removed_paths,
)
from lakesink_reader.format.v3.vlog import HEADER_READ_BYTES
from lakesink_reader.names import TABLE_FILE
from lakesink_reader.storage.local import LocalStorage
from tests.lakes import v3_table

TABLE = "7ab1e000000000000000000000000001"
OTHER_TABLE = "7ab1e000000000000000000000000002"


@pytest.fixture(autouse=True)
def _table_json(tmp_path: Path) -> None:
    """The lake's table.json naming TABLE: a writer checks it before it creates version 0."""
    v3_table(str(tmp_path), table_id=TABLE)


RUN = "run-0000000000000001"
W1 = "11111111-1111-4111-8111-111111111111"
W2 = "22222222-2222-4222-8222-222222222222"
W3 = "33333333-3333-4333-8333-333333333333"


def add(path: str, rows: int = 10, size: int = 1000, partition: int | None = 0, **kw: Any) -> AddFile:
    return AddFile(path, rows, size, partition, **kw)


def append(writer: str, batch: int, *files: AddFile, **kw: Any) -> PendingCommit:
    return PendingCommit.append(writer_id=writer, batch=batch, run=RUN, adds=files, **kw)


def compaction(base: int, inputs: list[str], output: str, op: str | None = None) -> PendingCommit:
    return PendingCommit.compact(
        op_token=op or new_op_token(),
        base_version=base,
        removes=[RemoveFile(p, 10, 1000) for p in inputs],
        adds=[add(output, rows=10 * len(inputs), size=1000 * len(inputs), partition=None)],
    )


def folded(*pendings: PendingCommit) -> TableState:
    """The state after committing ``pendings`` at versions 0, 1, ..."""
    state = TableState.empty(TABLE)
    for pending in pendings:
        state = state.fold(pending.at(state.version + 1, TABLE).header)
    return state


def log_versions(storage: LocalStorage) -> list[int]:
    names = (f.name.rsplit("/", 1)[-1] for f in storage.list(LOG_DIR))
    return sorted(v for v in (parse_commit_name(n) for n in names) if v is not None)


def no_sleep(seconds: float) -> None:
    pass


class HookedStorage(LocalStorage):
    """Local disk whose creates of log commits call ``before`` (it may raise: the request never
    arrived) and ``after`` (it may raise: the create was applied, its answer lost)."""

    Hook = Callable[[str, bytes], None]

    def __init__(self, root: Path, before: Hook | None = None, after: Hook | None = None) -> None:
        super().__init__(str(root))
        self.before, self.after = before, after
        self.creates: list[str] = []

    def put_if_absent(self, name: str, data: bytes) -> bool:
        if not name.startswith(f"{LOG_DIR}/"):
            return super().put_if_absent(name, data)
        self.creates.append(name)
        if self.before is not None:
            self.before(name, data)
        created = super().put_if_absent(name, data)
        if self.after is not None:
            self.after(name, data)
        return created


class HeadReadingStorage(LocalStorage):
    """Local disk that counts its reads: of the first bytes of a file, and of whole files."""

    def __init__(self, root: Path) -> None:
        super().__init__(str(root))
        self.head_reads: list[int] = []
        self.whole_reads: list[str] = []

    def read_bytes(self, name: str, *, first_contact: bool = False, limit: int | None = None) -> bytes:
        data = super().read_bytes(name, first_contact=first_contact, limit=limit)
        if limit is None:
            self.whole_reads.append(name)
        else:
            self.head_reads.append(len(data))
        return data


# The codec ------------------------------------------------------------------------------------


def every_kind() -> list[PendingCommit]:
    stats = {
        "numRecords": 10,
        "minValues": {"id": 0, "name": "ä"},
        "maxValues": {"id": 9},
        "nullCount": {"id": 0},
    }
    return [
        append(
            W1,
            3,
            add("w1-b3-p1.parquet", partition=1, stats=stats),
            add("w1-b3-p0.parquet", size=5 * MIB),
            source_offsets=({"ev": {"0": 12, "1": 7}},),  # a tuple: reads back as a list
            allow_other_queries=True,
        ),
        append(
            W2,
            0,
            continues=Continuation(W1, 3, 0, [{"ev": {"0": 12, "1": 7}}], "kafka"),
        ),
        compaction(4, ["a.parquet", "b.parquet"], "c0123456789abcdef-00000-x.parquet"),
        PendingCommit.abandon(op_token=new_op_token(), abandons="0123456789abcdef"),
        PendingCommit.vacuum(op_token=new_op_token(), retained_from=2),
        PendingCommit.upgrade(
            op_token="fedcba9876543210", fence_epoch=41, token="v2-" + "a" * 32, committed_at=1.5
        ),
    ]


@pytest.mark.parametrize("pending", every_kind(), ids=lambda p: p.kind)
def test_a_commit_round_trips_through_canonical_bytes(pending: PendingCommit) -> None:
    commit = pending.at(7, TABLE)
    data = encode_commit(commit)
    decoded = decode_commit(data, where="v7")
    assert decoded == commit and encode_commit(decoded) == data  # same commit -> same bytes
    assert encode_commit(pending.at(7, TABLE)) == data
    lines = data.decode("utf-8").split("\n")
    assert lines[-1] == "" and len(lines) == 2 + len(commit.adds) + len(commit.removes)
    for line in lines[:-1]:  # keys sorted, no spaces, UTF-8 as is: the one canonical text
        assert line == json.dumps(json.loads(line), sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    header = json.loads(lines[0])["commit"]
    assert header["version"] == 7 and header["read_version"] == 6 and header["format_version"] == 3
    assert decode_header(data, where="v7") == commit.header


def test_equal_commits_give_equal_bytes_whatever_the_order_of_their_files() -> None:
    files = [add(f"f{i}.parquet", partition=i) for i in range(5)]
    one = append(W1, 0, *files, token="a" * 32, committed_at=10.0)
    other = append(W1, 0, *reversed(files), token="a" * 32, committed_at=10.0)
    assert encode_commit(one.at(0, TABLE)) == encode_commit(other.at(0, TABLE))
    assert encode_commit(one.at(0, TABLE)) != encode_commit(one.at(1, TABLE))  # a version's bytes are its own
    header = one.at(0, TABLE).header
    assert header.read_version is None and header.counts.add_files == 5 and header.counts.add_rows == 50
    assert header.writer is not None and header.writer.tag == "1111111111114111" == writer_tag(W1)
    assert len(writer_tag("v2-unknown")) == 16  # not a UUID: a hash, of the same shape


def corrupted(change: Callable[[list[dict[str, Any]]], None]) -> bytes:
    commit = append(W1, 0, add("a.parquet"), add("b.parquet")).at(0, TABLE)
    docs = [json.loads(line) for line in encode_commit(commit).splitlines()]
    change(docs)
    return b"".join(json.dumps(d).encode() + b"\n" for d in docs)


@pytest.mark.parametrize(
    ("data", "error", "match"),
    [
        (corrupted(lambda d: None)[:-1], CorruptFileError, "truncated"),
        (
            b"\n".join([*corrupted(lambda d: None).split(b"\n")[:2], b"{not json", b""]),
            CorruptFileError,
            "line 3 is not JSON",
        ),
        # more action lines than the header counts: refused before one is decoded (issue 51)
        (
            corrupted(lambda d: None) + b"{not json\n",
            CorruptFileError,
            "3 action lines, but its header counts 2",
        ),
        (corrupted(lambda d: d[1].update(add="x")), CorruptFileError, "line 2: add must be a JSON object"),
        (corrupted(lambda d: d[0]["commit"]["counts"].update(add_rows=21)), CorruptFileError, "counts"),
        (corrupted(lambda d: d[0]["commit"].update(format_version=4)), FormatVersionError, "version 4"),
        (corrupted(lambda d: d[0]["commit"].update(format_version=2)), CorruptFileError, "not a format-v3"),
        (corrupted(lambda d: d[0]["commit"].update(read_version=3)), CorruptFileError, "read_version"),
        (
            corrupted(
                lambda d: (
                    d.append({"remove": {"path": "z", "rows": 1, "bytes": 1}}),
                    d[0]["commit"]["counts"].update(remove_files=1),
                )
            ),
            CorruptFileError,
            "before",
        ),
        (corrupted(lambda d: d[2]["add"].update(path="../x.parquet")), CorruptFileError, "relative"),
        (corrupted(lambda d: d[2]["add"].update(path="a.parquet")), CorruptFileError, "twice"),
        (corrupted(lambda d: d[0]["commit"]["writer"].update(tag="0" * 16)), CorruptFileError, "not the tag"),
        (corrupted(lambda d: d[0]["commit"].update(op={"token": "0" * 16})), CorruptFileError, "no op"),
    ],
)
def test_a_malformed_commit_is_refused_naming_the_file_and_the_problem(
    data: bytes, error: type[Exception], match: str
) -> None:
    with pytest.raises(error, match=match) as caught:
        decode_commit(data, where="/lake/_lakesink/log/00000000000000000000.json")
    assert "/lake/_lakesink/log/00000000000000000000.json" in str(caught.value)


def test_builders_refuse_commits_that_break_the_shape_of_their_kind() -> None:
    with pytest.raises(ValueError, match="relative to the table root"):
        append(W1, 0, add("_lakesink/log/x.json"))
    with pytest.raises(ValueError, match="twice"):
        append(W1, 0, add("a.parquet"), add("a.parquet", partition=1))
    with pytest.raises(ValueError, match="removes at least one"):
        PendingCommit.compact(op_token=new_op_token(), base_version=0, removes=[], adds=[])
    with pytest.raises(ValueError, match="no batch and no partition"):
        PendingCommit.compact(
            op_token=new_op_token(), base_version=0, removes=[RemoveFile("a", 1, 1)], adds=[add("b")]
        )
    with pytest.raises(ValueError, match="stats of 'a' must be plain JSON"):
        append(W1, 0, add("a", stats={"minValues": {"x": float("nan")}}))
    with pytest.raises(ValueError, match="op token"):
        PendingCommit.abandon(op_token=new_op_token(), abandons="not-a-token")
    with pytest.raises(ValueError, match="only batch 0 continues a writer"):
        append(W2, 1, continues=Continuation(W1, 0, 0, None, "equal"))
    with pytest.raises(
        ValueError, match=r"op.trigger must be one of \['auto'\] in a compact commit, got 'cron'"
    ):
        PendingCommit.compact(
            op_token=new_op_token(), base_version=0, removes=[RemoveFile("a", 1, 1)], adds=[], trigger="cron"
        )


def test_an_auto_compaction_says_so_and_a_manual_one_keeps_its_bytes() -> None:
    """The compact op's optional ``trigger``: written only on an auto-compaction, read back."""

    def commit(trigger: str | None) -> bytes:
        pending = PendingCommit.compact(
            op_token="0" * 16, base_version=0, removes=[RemoveFile("a", 1, 1)], adds=[], trigger=trigger,
            token="t" * 8, committed_at=1.0,
        )  # fmt: skip
        return encode_commit(pending.at(1, "f" * 32))

    manual, auto = commit(None), commit("auto")
    assert b"trigger" not in manual
    assert json.loads(auto.splitlines()[0])["commit"]["op"] == {
        "token": "0" * 16,
        "base_version": 0,
        "trigger": "auto",
    }
    assert decode_commit(auto, where="v1").header.op.trigger == "auto"  # type: ignore[union-attr]
    assert decode_commit(manual, where="v1").header.op.trigger is None  # type: ignore[union-attr]


def test_the_header_is_read_without_the_actions(tmp_path: Path) -> None:
    files = [add(f"w{'0' * 15}1-b{0:012d}-p{i:05d}-{'0' * 16}.parquet", partition=i) for i in range(1500)]
    commit = append(W1, 0, *files).at(0, TABLE)
    data = encode_commit(commit)
    assert len(data) > 2 * HEADER_READ_BYTES
    damaged = data.split(b"\n", 1)[0] + b"\n" + b"garbage\n" * 1500  # as many lines as it counts
    assert decode_header(damaged, where="v0") == commit.header  # the actions are never parsed
    with pytest.raises(CorruptFileError, match="line 2 is not JSON"):
        decode_commit(damaged, where="v0")

    storage = HeadReadingStorage(tmp_path)
    storage.put(commit_name(0), data)
    log = VersionedLogWriter(storage, TABLE)
    storage.whole_reads.clear()
    header = log.read_header(0)
    assert header == commit.header and header.counts.add_files == 1500
    assert storage.whole_reads == [] and storage.head_reads == [HEADER_READ_BYTES]  # not the whole object
    assert log.read_header(1) is None

    plain = LocalStorage(str(tmp_path / "plain"))  # shorter than a head read: one read, one line parsed
    plain.put(commit_name(0), damaged)
    assert VersionedLogWriter(plain, TABLE).read_header(0) == commit.header
    with pytest.raises(CorruptFileError, match="line 2 is not JSON"):
        VersionedLogWriter(plain, TABLE).read_commit(0)


# The state --------------------------------------------------------------------------------------


def test_the_fold_tracks_writers_ops_retention_and_counts() -> None:
    op = new_op_token()
    abandoned = new_op_token()
    state = folded(
        append(W1, 0, add("a.parquet"), add("big.parquet", size=3 * MIB), source_offsets=[{"o": 1}]),
        append(W2, 0, add("b.parquet"), allow_other_queries=True),
        append(W1, 1, add("c.parquet"), source_offsets=[{"o": 2}]),
        compaction(2, ["a.parquet", "c.parquet"], "c-out.parquet", op=op),
        PendingCommit.abandon(op_token=new_op_token(), abandons=abandoned),
        PendingCommit.vacuum(op_token=new_op_token(), retained_from=3),
        PendingCommit.vacuum(op_token=new_op_token(), retained_from=1),
    )
    w1, w2 = state.writers[W1], state.writers[W2]
    assert (w1.first_batch, w1.first_version, w1.last_batch, w1.last_version) == (0, 0, 1, 2)
    assert w1.offsets == [{"o": 2}] and not w1.allow_other_queries and w2.allow_other_queries
    assert state.ops[op].outcome == "committed" and state.ops[op].version == 3
    assert state.ops[abandoned].outcome == "abandoned" and state.ops[abandoned].kind is None
    assert state.retained_from == 3 and state.version == 6
    assert (state.counts.files, state.counts.rows, state.counts.bytes) == (3, 40, 3 * MIB + 3000)
    assert state.counts.histogram[0] == 2 and state.counts.histogram[2] == 1  # [2, 4) MiB
    assert state.writer(writer_tag(W2)) == w2 and state.writer("nobody") is None


def test_the_fold_refuses_a_batch_twice_a_hole_and_another_tables_commit() -> None:
    state = folded(append(W1, 0), append(W1, 1))
    with pytest.raises(CorruptFileError, match=r"version 2 .* batch 1 again"):
        state.fold(append(W1, 1).at(2, TABLE).header)
    with pytest.raises(CorruptFileError, match="version 3 cannot follow version 1"):
        state.fold(append(W1, 2).at(3, TABLE).header)
    with pytest.raises(CorruptFileError, match=f"table {OTHER_TABLE}, not to this table {TABLE}"):
        state.fold(append(W1, 2).at(2, OTHER_TABLE).header)
    with pytest.raises(CorruptFileError, match="removes more than is live"):
        folded(compaction(0, ["ghost-1.parquet", "ghost-2.parquet"], "out.parquet"))


def test_live_files_refuse_adding_a_live_path_and_removing_a_dead_one() -> None:
    live = LiveFiles()
    first = append(W1, 0, add("a.parquet"), add("b.parquet")).at(0, TABLE)
    live.apply(first)
    with pytest.raises(CorruptFileError, match=r"adds a\.parquet, which is live since version 0"):
        live.apply(append(W1, 1, add("a.parquet")).at(1, TABLE))
    with pytest.raises(CorruptFileError, match=r"removes x\.parquet, which is not live"):
        live.apply(compaction(0, ["a.parquet", "x.parquet"], "c.parquet").at(1, TABLE))
    assert [f.path for f in live] == ["a.parquet", "b.parquet"]  # a refused commit changes nothing
    live.apply(compaction(0, ["a.parquet", "b.parquet"], "c.parquet").at(1, TABLE))
    assert [(f.path, f.added_version, f.writer) for f in live] == [("c.parquet", 1, None)]


# The rules of section 8, in the order of its table (the epoch-0 case first) ---------------------


def test_rule_a_new_writer_at_a_batch_above_zero_is_refused_also_on_an_empty_lake(tmp_path: Path) -> None:
    # v2 skipped its checks at epoch 0 and accepted any first epoch on an empty log: a lake deleted
    # and recreated under an old checkpoint took the old query's batches as if nothing was lost.
    lake = folded(append(W1, 0), append(W1, 1))
    with pytest.raises(
        CommitRefusedError, match=rf"{W2} is new .* batch 5: the lake has none of its batches 0..4"
    ):
        check_append(lake, append(W2, 5, allow_other_queries=True))
    with pytest.raises(
        CommitRefusedError, match=rf"new checkpoint location.*continue_writer.*{W1} \(last batch 1"
    ):
        check_append(lake, append(W2, 5))
    with pytest.raises(CommitRefusedError, match=r"batches 0\.\.2"):
        check_append(TableState.empty(TABLE), append(W1, 3))

    storage = LocalStorage(str(tmp_path))
    log = VersionedLogWriter(storage, TABLE)
    log.commit(append(W1, 0, add("a.parquet")))
    with pytest.raises(CommitRefusedError):
        log.commit(append(W2, 1, add("b.parquet"), allow_other_queries=True))
    assert log_versions(storage) == [0]  # refused before it wrote


def test_rule_a_new_writer_at_batch_zero_beside_others_needs_allow_other_queries(tmp_path: Path) -> None:
    lake = folded(append(W1, 0), append(W1, 1), append(W1, 2), append(W3, 0, allow_other_queries=True))
    with pytest.raises(CommitRefusedError) as refused:
        check_append(lake, append(W2, 0))
    message = str(refused.value)
    assert f"{W1} (last batch 2, at version 2" in message and f"{W3} (last batch 0, at version 3" in message
    assert "allow_other_queries=True" in message and "continue_writer" in message
    assert check_append(lake, append(W2, 0, allow_other_queries=True)) == "commit"

    log = VersionedLogWriter(LocalStorage(str(tmp_path)), TABLE)
    log.commit(append(W1, 0))
    with pytest.raises(CommitRefusedError, match=W1):
        log.commit(append(W2, 0))
    assert log.commit(append(W2, 0, allow_other_queries=True)).version == 1


def test_rule_a_retired_writer_is_refused_naming_its_successor() -> None:
    continued = continuation_of(W1, after_batch=1, after_version=1)
    lake = folded(append(W1, 0, source_offsets=OFFSETS), append(W1, 1, source_offsets=OFFSETS), continued)
    assert lake.writers[W1].retired and lake.writers[W1].continued_by == W2
    for batch in (1, 2):  # a replay as much as a next batch: the checkpoint is stale
        with pytest.raises(
            CommitRefusedError, match=f"{W1} was continued by {W2} at version 2; this checkpoint is stale"
        ):
            check_append(lake, append(W1, batch))


def test_rule_a_known_writer_replays_old_batches_commits_the_next_and_refuses_a_gap() -> None:
    lake = folded(append(W1, 0), append(W1, 1), append(W1, 2))
    assert [check_append(lake, append(W1, b)) for b in (0, 2, 3)] == ["replay", "replay", "commit"]
    with pytest.raises(CommitRefusedError, match=r"batches 3..4 are missing .*last batch is 2, at version 2"):
        check_append(lake, append(W1, 5))


OFFSETS = [{"ev": {"0": 1200, "1": 1187}}]


def continuation_of(
    old: str, *, after_batch: int, after_version: int, offsets: Any = OFFSETS, writer: str = W2
) -> PendingCommit:
    return append(writer, 0, continues=Continuation(old, after_batch, after_version, offsets, "kafka"))


def test_rule_a_continuation_commits_retires_its_writer_and_is_refused_when_it_does_not_fit() -> None:
    lake = folded(append(W1, 0, source_offsets=OFFSETS), append(W3, 0, allow_other_queries=True))
    assert check_append(lake, continuation_of(W1, after_batch=0, after_version=0)) == "commit"
    after = lake.fold(continuation_of(W1, after_batch=0, after_version=0).at(2, TABLE).header)
    assert after.writers[W1].retired_version == 2 and after.writers[W2].continues == W1
    with pytest.raises(CommitRefusedError, match=f"{W1} was already continued by {W2} at version 2"):
        check_append(after, continuation_of(W1, after_batch=0, after_version=0, writer="9" * 16))
    with pytest.raises(CommitRefusedError, match=f"{W1} committed since .* not 7 at version 9"):
        check_append(lake, continuation_of(W1, after_batch=7, after_version=9))
    with pytest.raises(CommitRefusedError, match="'nobody' is not a writer of this lake"):
        check_append(lake, continuation_of("nobody", after_batch=0, after_version=0))
    overlap = [{"ev": {"0": 1100, "1": 1187, "2": 5}}]
    with pytest.raises(CommitRefusedError) as refused:
        check_append(lake, continuation_of(W1, after_batch=0, after_version=0, offsets=overlap))
    assert "ev-0: starts at 1100, before 1200 (an overlap" in str(refused.value)
    assert "ev-2: new since the writer ended, so it must start at -2" in str(refused.value)
    assert "ev-1" not in str(refused.value)


def test_continuation_offsets_are_compared_per_partition_for_kafka_and_as_json_otherwise() -> None:
    assert continuation_problems(OFFSETS, [{"ev": {"0": 1200, "1": 1187, "9": -2}}]) == []
    # A partition added since the writer ended, from its start as Spark records it (-2 resolved).
    assert continuation_problems(OFFSETS, [{"ev": {"0": 1200, "1": 1187, "9": 0}}]) == []
    assert continuation_problems(OFFSETS, [{"ev": {"0": 1300, "1": -1}}]) == [
        "source 0 ev-0: starts at 1300, after 1200 (a gap: rows lost)",
        "source 0 ev-1: starts at -1 (latest/earliest), not at the offset 1187",
    ]
    assert continuation_problems(OFFSETS, [{"ev": {"0": 1200}}]) == [
        "source 0 ev-1: missing from the start offsets (a gap: 1187 is next)"
    ]
    assert continuation_problems([{"logOffset": 7}], [{"logOffset": 7}]) == []
    assert continuation_problems([{"logOffset": 7}], [{"logOffset": 8}]) != []
    assert continuation_problems(None, OFFSETS) != [] and continuation_problems(OFFSETS, [*OFFSETS, {}]) != []


def test_rule_the_first_writer_and_one_beside_only_retired_writers_commit() -> None:
    assert check_append(TableState.empty(TABLE), append(W1, 0)) == "commit"
    retired_only = folded(
        append(W1, 0, source_offsets=OFFSETS), continuation_of(W1, after_batch=0, after_version=0, writer=W2)
    )
    with pytest.raises(CommitRefusedError, match=W2):  # W2 is live: a third writer needs the option
        check_append(retired_only, append(W3, 0))
    assert check_append(folded(append(W1, 0)), append(W3, 0, allow_other_queries=True)) == "commit"


def test_rule_a_new_writer_with_the_tag_of_another_is_refused() -> None:
    lake = folded(append(W1, 0))
    twin_tag = W1[:18] + "ffff-ffffffffffff"  # same first 16 hex digits, another query id
    assert writer_tag(twin_tag) == writer_tag(W1)
    with pytest.raises(CommitRefusedError, match="has the tag 1111111111114111 of writer"):
        check_append(lake, append(twin_tag, 0, allow_other_queries=True))


# The compaction rule of section 10 --------------------------------------------------------------


def test_a_compaction_conflicts_only_when_one_of_its_inputs_was_removed_concurrently() -> None:
    base = [append(W1, 0, add("a"), add("b"), add("c"), add("d"))]
    ours = compaction(0, ["a", "b"], "out-1")
    later = [append(W1, 1, add("e")), compaction(0, ["c"], "out-2")]  # appends, and other inputs
    commits = [p.at(v, TABLE) for v, p in enumerate([*base, *later])]
    state = folded(*base, *later)
    assert check_compaction(state, ours, removed_paths(commits[1:])) == "commit"
    conflicting = compaction(0, ["d", "b"], "out-3")
    commits.append(conflicting.at(3, TABLE))
    state = state.fold(commits[-1].header)
    with pytest.raises(CommitConflictError, match=r"removed 1 of its inputs: b \(removed at version 3\)"):
        check_compaction(state, ours, removed_paths(commits[1:]))
    assert check_compaction(state, conflicting, {}) == "replay"  # its own op, committed already
    abandoned = compaction(0, ["a"], "out-4")
    assert abandoned.op is not None
    state = state.fold(
        PendingCommit.abandon(op_token=new_op_token(), abandons=abandoned.op.token).at(4, TABLE).header
    )
    with pytest.raises(CommitConflictError, match="was abandoned at version 4"):
        check_compaction(state, abandoned, {})


def test_compactions_through_the_log_conflict_on_shared_inputs_also_after_a_lost_race(tmp_path: Path) -> None:
    storage = LocalStorage(str(tmp_path))
    log = VersionedLogWriter(storage, TABLE, sleep=no_sleep)
    log.commit(append(W1, 0, add("a"), add("b"), add("c"), add("d")))
    first = compaction(0, ["a", "b"], "out-1")
    log.commit(append(W1, 1, add("e")))
    assert log.commit(first).version == 2
    assert log.commit(compaction(0, ["c"], "out-2")).status == "committed"  # disjoint inputs, same base
    with pytest.raises(CommitConflictError, match=r"b \(removed at version 2\)"):
        log.commit(compaction(0, ["b", "d"], "out-3"))
    assert log.commit(first).status == "replayed"
    assert log_versions(storage) == [0, 1, 2, 3]

    def rival_compacts_d_first(name: str, data: bytes) -> None:
        if name == commit_name(4):  # between our check and our create
            VersionedLogWriter(storage, TABLE).commit(compaction(3, ["d"], "out-4"))

    raced = VersionedLogWriter(HookedStorage(tmp_path, before=rival_compacts_d_first), TABLE, sleep=no_sleep)
    with pytest.raises(CommitConflictError, match=r"d \(removed at version 4\)"):
        raced.commit(compaction(3, ["d", "e"], "out-5"))
    assert log_versions(storage) == [0, 1, 2, 3, 4]


# The log on storage -----------------------------------------------------------------------------


def test_commits_land_at_the_next_version_and_a_state_carries_over(tmp_path: Path) -> None:
    storage = LocalStorage(str(tmp_path))
    log = VersionedLogWriter(storage, TABLE)
    assert log.open() == TableState.empty(TABLE)
    first = log.commit(append(W1, 0, add("a")))
    assert (first.status, first.version, first.lost_races) == ("committed", 0, 0)
    VersionedLogWriter(storage, TABLE).commit(
        append(W2, 0, add("b"), allow_other_queries=True)
    )  # another process
    pending = append(W1, 1, add("c"))
    second = log.commit(pending, state=first.state)  # the state is brought forward past W2's commit
    assert second.version == 2 and second.state == log.open()
    assert log.read_commit(2) == pending.at(2, TABLE)
    with pytest.raises(ValueError, match="upgrade commits are not raced"):
        log.commit(
            PendingCommit.upgrade(op_token="0" * 16, fence_epoch=1, token="v2-" + "0" * 32, committed_at=0)
        )


def test_a_replay_of_a_batch_is_skipped_whole_whatever_its_files(tmp_path: Path) -> None:
    storage = LocalStorage(str(tmp_path))
    log = VersionedLogWriter(storage, TABLE)
    log.commit(append(W1, 0, add("b0-p0")))
    log.commit(append(W1, 1, add("b1-p0"), add("b1-p1", partition=1)))
    replay = log.commit(append(W1, 1, *(add(f"b1-again-p{p}", partition=p) for p in range(3))))
    assert (replay.status, replay.version) == ("replayed", 1)
    assert log.commit(append(W1, 0, add("b0-again"))).status == "replayed"
    assert log_versions(storage) == [0, 1]
    assert [a.path for a in log.read_commit(1).adds] == ["b1-p0", "b1-p1"]  # type: ignore[union-attr]


def test_a_lost_answer_commits_exactly_once_and_never_at_the_next_version(tmp_path: Path) -> None:
    answers_to_lose = [1]

    def lose_the_answer(name: str, data: bytes) -> None:
        if answers_to_lose[0]:
            answers_to_lose[0] -= 1
            raise TimeoutError(f"the answer to the create of {name} was lost")

    storage = HookedStorage(tmp_path, after=lose_the_answer)
    pending = append(W1, 0, add("a"))
    result = VersionedLogWriter(storage, TABLE, sleep=no_sleep).commit(pending)
    assert (result.status, result.version) == ("committed", 0)
    assert storage.creates == [commit_name(0), commit_name(0)]  # retried at 0, never tried at 1
    assert log_versions(storage) == [0]
    assert storage.read_bytes(commit_name(0)) == encode_commit(pending.at(0, TABLE))
    assert VersionedLogWriter(storage, TABLE).commit(append(W1, 1)).version == 1


def test_an_answer_that_stays_unknown_raises_state_unknown_and_the_replay_settles_it(tmp_path: Path) -> None:
    def lose_every_answer(name: str, data: bytes) -> None:
        raise ConnectionResetError(f"connection reset after the create of {name}")

    storage = HookedStorage(tmp_path, after=lose_every_answer)
    pending = append(W1, 0, add("a"))
    with pytest.raises(CommitStateUnknownError, match="may have been applied") as unknown:
        VersionedLogWriter(storage, TABLE, retry=RetryPolicy(create_attempts=3), sleep=no_sleep).commit(
            pending
        )
    assert isinstance(unknown.value, CommitError)  # existing `except CommitError` callers still catch it
    assert storage.creates == [commit_name(0)] * 3 and log_versions(storage) == [0]
    replay = VersionedLogWriter(LocalStorage(str(tmp_path)), TABLE).commit(append(W1, 0, add("a-again")))
    assert (replay.status, replay.version) == ("replayed", 0)  # the replay finds it committed


@pytest.mark.parametrize("first_error", [PermissionError, TimeoutError])
def test_a_refused_create_is_a_plain_failure_unless_an_earlier_try_may_have_landed(
    tmp_path: Path, first_error: type[Exception]
) -> None:
    errors = [first_error("first try"), PermissionError("access denied")]

    def fail(name: str, data: bytes) -> None:
        raise errors.pop(0)

    storage = HookedStorage(tmp_path, before=fail)
    log = VersionedLogWriter(storage, TABLE, sleep=no_sleep)
    expected = PermissionError if first_error is PermissionError else CommitStateUnknownError
    with pytest.raises(expected):
        log.commit(append(W1, 0, add("a")))
    assert log_versions(storage) == []


def test_a_create_that_failed_moves_on_only_once_another_commit_is_seen_at_its_version(
    tmp_path: Path,
) -> None:
    def rival_wins_then_our_request_fails(name: str, data: bytes) -> None:
        if name == commit_name(0) and not log_versions(storage):
            VersionedLogWriter(LocalStorage(str(tmp_path)), TABLE).commit(append(W2, 0, add("theirs")))
            raise ConnectionError("our request never arrived")

    storage = HookedStorage(tmp_path, before=rival_wins_then_our_request_fails)
    pending = append(W1, 0, add("ours"), allow_other_queries=True)
    result = VersionedLogWriter(storage, TABLE, sleep=no_sleep).commit(pending)
    # 0: failed, retried at 0 with the same bytes: another commit's there (definitive); then 1.
    assert storage.creates == [commit_name(0), commit_name(0), commit_name(1)]
    assert (result.status, result.version, result.lost_races) == ("committed", 1, 1)
    ours = VersionedLogWriter(storage, TABLE).read_commit(1)
    assert ours is not None and ours.header.token == pending.token and ours.header.read_version == 0


def test_a_twin_that_commits_the_batch_first_makes_a_lost_race(tmp_path: Path) -> None:
    def twin_commits_first(name: str, data: bytes) -> None:
        if not log_versions(storage):
            VersionedLogWriter(LocalStorage(str(tmp_path)), TABLE).commit(append(W1, 0, add("twin")))

    storage = HookedStorage(tmp_path, before=twin_commits_first)
    result = VersionedLogWriter(storage, TABLE, sleep=no_sleep).commit(append(W1, 0, add("ours")))
    assert (result.status, result.version, result.lost_races) == ("lost_race", 0, 1)
    assert log_versions(storage) == [0] and storage.creates == [commit_name(0)]


def test_too_many_lost_races_is_a_conflict_and_commits_nothing(tmp_path: Path) -> None:
    def another_writer_wins(name: str, data: bytes) -> None:
        batch = len(log_versions(storage))
        VersionedLogWriter(LocalStorage(str(tmp_path)), TABLE).commit(
            append(W2, batch, add(f"theirs-{batch}"))
        )

    storage = HookedStorage(tmp_path, before=another_writer_wins)
    log = VersionedLogWriter(storage, TABLE, retry=RetryPolicy(max_lost_races=3), sleep=no_sleep)
    with pytest.raises(CommitConflictError, match="lost 3 versions in a row"):
        log.commit(append(W1, 0, allow_other_queries=True))
    assert log_versions(storage) == [0, 1, 2] and set(log.open().writers) == {W2}


def test_eight_writers_append_at_once_each_batch_once_in_a_contiguous_log(tmp_path: Path) -> None:
    storage = LocalStorage(str(tmp_path))
    writers = [f"{i:08x}-0000-4000-8000-000000000000" for i in range(1, 9)]
    batches = 10
    start_together = threading.Barrier(len(writers), timeout=60)

    def write(writer: str) -> list[tuple[str, int]]:
        log = VersionedLogWriter(storage, TABLE)
        outcomes: list[tuple[str, int]] = []
        state = None
        for batch in range(batches):
            start_together.wait()
            pending = append(writer, batch, add(f"{writer[:8]}-b{batch}"), allow_other_queries=True)
            committed = log.commit(pending, state=state)
            replayed = log.commit(
                append(writer, batch, add(f"{writer[:8]}-b{batch}-replay")), state=committed.state
            )
            outcomes += [(committed.status, committed.lost_races), (replayed.status, replayed.lost_races)]
            state = replayed.state
        return outcomes

    with ThreadPoolExecutor(len(writers)) as pool:
        outcomes = [o for per_writer in pool.map(write, writers) for o in per_writer]
    assert Counter(status for status, _ in outcomes) == {"committed": 80, "replayed": 80}
    assert sum(lost for _, lost in outcomes) > 0  # the writers did race for versions
    assert log_versions(storage) == list(range(80))  # contiguous, nothing else
    log = VersionedLogWriter(storage, TABLE)
    commits = [log.read_commit(v) for v in range(80)]
    batches_committed = Counter((c.header.writer.id, c.header.writer.batch) for c in commits)  # type: ignore[union-attr]
    assert batches_committed == {(w, b): 1 for w in writers for b in range(batches)}
    assert not any(a.path.endswith("-replay") for c in commits for a in c.adds)  # type: ignore[union-attr]
    state = log.open()
    assert state.version == 79 and state.counts.files == 80
    assert all(state.writers[w].last_batch == batches - 1 for w in writers)


def test_a_commit_of_another_table_is_corrupt(tmp_path: Path) -> None:
    storage = LocalStorage(str(tmp_path))
    ours = VersionedLogWriter(storage, TABLE)
    kept = ours.commit(append(W1, 0)).state
    # The lake is deleted and recreated (another table id) under the writer.
    storage.delete(commit_name(0))
    storage.delete(TABLE_FILE)
    v3_table(str(tmp_path), table_id=OTHER_TABLE)
    VersionedLogWriter(storage, OTHER_TABLE).commit(append(W2, 0))
    VersionedLogWriter(storage, OTHER_TABLE).commit(append(W2, 1))
    for read in (ours.open, lambda: ours.read_header(1), lambda: ours.commit(append(W1, 1), state=kept)):
        with pytest.raises(CorruptFileError, match=f"belongs to table {OTHER_TABLE}.*writes table {TABLE}"):
            read()
    with pytest.raises(CorruptFileError, match="the log was replaced"):  # same table id, another commit
        VersionedLogWriter(storage, OTHER_TABLE).refresh(TableState(OTHER_TABLE, 0, "0" * 32, 0.0))
    assert log_versions(storage) == [0, 1]


def test_a_log_missing_its_first_versions_is_refused_without_checkpoints(tmp_path: Path) -> None:
    storage = LocalStorage(str(tmp_path))
    log = VersionedLogWriter(storage, TABLE)
    for batch in range(3):
        log.commit(append(W1, batch))
    storage.delete(commit_name(0))
    storage.delete(commit_name(1))
    with pytest.raises(CorruptFileError, match="has no version 0 but has versions from 2"):
        log.open()


def test_derived_work_runs_after_the_commit_point_and_its_failure_does_not_undo_it(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    seen: list[tuple[int, int]] = []

    def checkpoint(commit: Commit, state: TableState) -> None:
        seen.append((commit.version, state.version))
        raise OSError("disk full")

    log = VersionedLogWriter(LocalStorage(str(tmp_path)), TABLE, after_commit=checkpoint)
    assert log.commit(append(W1, 0)).status == "committed"
    assert log.commit(append(W1, 0)).status == "replayed"  # no commit point, no derived work
    assert seen == [(0, 0)] and "derived work after version 0" in caplog.text

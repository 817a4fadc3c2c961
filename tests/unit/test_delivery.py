"""The delivery identity (docs/upstream.md#the-lane-commit): a change's paths, modes and blobs in scope, `.imm/` left out."""

from lanes_es.domain.delivery import delivery_identity as identity_in_scope, parse_raw_diff

SCOPE = ["src/a.txt", "src/b.txt", "src/c.txt"]


def delivery_identity(changes):
    return identity_in_scope(changes, "s1", SCOPE)

A = ("src/a.txt", "100644", "1" * 40)
B = ("src/b.txt", "100755", "2" * 40)


def test_the_identity_ignores_order_and_the_kernels_own_files():
    audit = (".imm/audit/s1/run-1/task-record.json", "100644", "3" * 40)
    assert delivery_identity([A, B]) == delivery_identity([B, audit, A])
    assert delivery_identity([A, B]).startswith("sha256:")


def test_a_changed_blob_mode_or_path_changes_the_identity():
    base = delivery_identity([A, B])
    assert delivery_identity([A, (B[0], B[1], "4" * 40)]) != base
    assert delivery_identity([A, (B[0], "100644", B[2])]) != base
    assert delivery_identity([A]) != base
    assert delivery_identity([A, B, ("src/c.txt", "000000", "0" * 40)]) != base  # a deletion counts


def test_raw_diff_tree_output_is_read_path_by_path():
    raw = (f":100644 100644 {'a' * 40} {'1' * 40} M\0src/a.txt\0"
           f":000000 100755 {'0' * 40} {'2' * 40} A\0src/b.txt\0").encode()
    assert parse_raw_diff(raw) == [A, B]


def test_a_change_outside_the_scope_is_no_part_of_the_delivery():
    stray = ("stray.txt", "100644", "5" * 40)
    assert delivery_identity([A, B, stray]) == delivery_identity([A, B])


def test_a_raw_diff_keeps_the_old_mode_for_the_fast_path_check():
    from lanes_es.domain.delivery import parse_raw_diff_with_old_mode

    raw = f":100755 000000 {'a' * 40} {'0' * 40} D\0src/c.txt\0".encode()
    assert parse_raw_diff_with_old_mode(raw) == [("src/c.txt", "100755", "000000", "0" * 40)]


def test_an_index_built_from_nothing_is_trusted_unless_a_tracked_entry_only_head_knew_shows():
    from lanes_es.domain.delivery import tracked_entries_unseen

    on_disk = {"kept-but-ignored.txt", "sub"}
    exists = on_disk.__contains__
    blob = "1" * 40
    assert not tracked_entries_unseen([("new.txt", "000000", "100644", blob),       # untracked, added
                                       ("gone.txt", "100644", "000000", "0" * 40),  # deleted on disk
                                       ("a.txt", "100644", "100644", blob),         # edited
                                       ("run.sh", "100644", "100755", blob)], exists)  # chmod +x
    assert tracked_entries_unseen([("kept-but-ignored.txt", "100644", "000000", "0" * 40)], exists)
    assert tracked_entries_unseen([("sub", "160000", "000000", "0" * 40)], exists)  # uninitialized submodule
    assert tracked_entries_unseen([("run.sh", "100755", "100644", blob)], exists)   # core.fileMode off
    assert tracked_entries_unseen([("link", "120000", "100644", blob)], exists)     # core.symlinks off

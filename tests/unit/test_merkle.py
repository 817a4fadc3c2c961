"""RFC 6962 hashing and proofs against the Certificate Transparency test vectors
(transparency-dev/merkle, proof/verify_test.go; the same leaves and roots as the CT C++ tests)."""

from __future__ import annotations

import pytest

from lanes_es.audit import merkle

LEAVES = [bytes.fromhex(h) for h in ["", "00", "10", "2021", "3031", "40414243", "5051525354555657",
                                       "606162636465666768696a6b6c6d6e6f"]]
ROOTS = [bytes.fromhex(h) for h in [
    "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855",
    "6e340b9cffb37a989ca544e6bb780a2c78901d3fb33738768511a30617afa01d",
    "fac54203e7cc696cf0dfcb42c92a1d9dbaf70ad9e621f4bd8d98662f00e3c125",
    "aeb6bcfe274b70a14fb067a5e5578264db0fa9b51af5e0ba159158f329e06e77",
    "d37ee418976dd95753c1c73862b9398fa2a2cf9b4ff0fdfe8b30cd95209614b7",
    "4e3bbb1f7b478dcfe71fb631631519a3bca12c9aefca1612bfce4c13a86264d4",
    "76e67dadbcdf1e10e1b74ddc608abd2f98dfb16fbce75277b5232a127f2087ef",
    "ddb89be403809e325750d3d263cd78929c2942b7942a34b77e122c9594a74c8c",
    "5dc9da79a70659a9ad559cb701ded9a2ab9d823aad2f4960cfe370eff4604328",
]]
HASHES = [merkle.leaf_hash(leaf) for leaf in LEAVES]


def h(*values: str) -> list[bytes]:
    return [bytes.fromhex(value) for value in values]


# (leaf number counted from 1, tree size, proof)
INCLUSION = [
    (1, 8, h("96a296d224f285c67bee93c30f8a309157f0daa35dc5b87e410b78630a09cfc7",
             "5f083f0a1a33ca076a95279832580db3e0ef4584bdff1f54c8a360f50de3031e",
             "6b47aaf29ee3c2af9af889bc1fb9254dabd31177f16232dd6aab035ca39bf6e4")),
    (6, 8, h("bc1a0643b12e4d2d7c77918f44e0f4f79a838b6cf9ec5b5c283e1f4d88599e6b",
             "ca854ea128ed050b41b35ffc1b87b8eb2bde461e9e3b5596ece6b9d5975a0ae0",
             "d37ee418976dd95753c1c73862b9398fa2a2cf9b4ff0fdfe8b30cd95209614b7")),
    (3, 3, h("fac54203e7cc696cf0dfcb42c92a1d9dbaf70ad9e621f4bd8d98662f00e3c125")),
    (2, 5, h("6e340b9cffb37a989ca544e6bb780a2c78901d3fb33738768511a30617afa01d",
             "5f083f0a1a33ca076a95279832580db3e0ef4584bdff1f54c8a360f50de3031e",
             "bc1a0643b12e4d2d7c77918f44e0f4f79a838b6cf9ec5b5c283e1f4d88599e6b")),
]
CONSISTENCY = [
    (1, 8, h("96a296d224f285c67bee93c30f8a309157f0daa35dc5b87e410b78630a09cfc7",
             "5f083f0a1a33ca076a95279832580db3e0ef4584bdff1f54c8a360f50de3031e",
             "6b47aaf29ee3c2af9af889bc1fb9254dabd31177f16232dd6aab035ca39bf6e4")),
    (6, 8, h("0ebc5d3437fbe2db158b9f126a1d118e308181031d0a949f8dededebc558ef6a",
             "ca854ea128ed050b41b35ffc1b87b8eb2bde461e9e3b5596ece6b9d5975a0ae0",
             "d37ee418976dd95753c1c73862b9398fa2a2cf9b4ff0fdfe8b30cd95209614b7")),
    (2, 5, h("5f083f0a1a33ca076a95279832580db3e0ef4584bdff1f54c8a360f50de3031e",
             "bc1a0643b12e4d2d7c77918f44e0f4f79a838b6cf9ec5b5c283e1f4d88599e6b")),
    (6, 7, h("0ebc5d3437fbe2db158b9f126a1d118e308181031d0a949f8dededebc558ef6a",
             "b08693ec2e721597130641e8211e7eedccb4c26413963eee6c1e2ed16ffb1a5f",
             "d37ee418976dd95753c1c73862b9398fa2a2cf9b4ff0fdfe8b30cd95209614b7")),
]


def test_roots_of_every_prefix_match_the_reference():
    assert [merkle.root_of(HASHES[:size]) for size in range(9)] == ROOTS


@pytest.mark.parametrize("leaf, size, proof", INCLUSION)
def test_inclusion_proofs_are_the_reference_proofs_and_verify(leaf, size, proof):
    assert merkle.inclusion_proof(leaf - 1, HASHES[:size]) == proof
    assert merkle.verify_inclusion(leaf - 1, size, HASHES[leaf - 1], proof, ROOTS[size])


@pytest.mark.parametrize("leaf, size, proof", INCLUSION)
def test_corrupted_inclusion_proofs_fail(leaf, size, proof):
    index, root, leaf_value = leaf - 1, ROOTS[size], HASHES[leaf - 1]
    probes = [(index - 1, size, leaf_value, proof, root), (index + 1, size, leaf_value, proof, root),
              (index ^ 2, size, leaf_value, proof, root), (index, size * 2, leaf_value, proof, root),
              (index, size // 2, leaf_value, proof, root), (index, size, b"WrongLeaf", proof, root),
              (index, size, leaf_value, proof, ROOTS[0]), (index, size, leaf_value, proof + [b""], root),
              (index, size, leaf_value, proof + [root], root), (index, size, leaf_value, [root] + proof, root),
              (index, size, leaf_value, proof[:-1], root)]
    for position in range(len(proof)):
        flipped = list(proof)
        flipped[position] = bytes([flipped[position][0] ^ 8]) + flipped[position][1:]
        probes.append((index, size, leaf_value, flipped, root))
    for probe in probes:
        assert not merkle.verify_inclusion(*probe), probe[:2]


@pytest.mark.parametrize("old, new, proof", CONSISTENCY)
def test_consistency_proofs_are_the_reference_proofs_and_verify(old, new, proof):
    assert merkle.consistency_proof(old, HASHES[:new]) == proof
    assert merkle.verify_consistency(old, new, ROOTS[old], ROOTS[new], proof)


@pytest.mark.parametrize("old, new, proof", CONSISTENCY)
def test_corrupted_consistency_proofs_fail(old, new, proof):
    r1, r2 = ROOTS[old], ROOTS[new]
    probes = [(old - 1, new, r1, r2, proof), (old + 1, new, r1, r2, proof), (old ^ 2, new, r1, r2, proof),
              (old, new * 2, r1, r2, proof), (old, new // 2, r1, r2, proof), (old, new, b"WrongRoot", r2, proof),
              (old, new, r1, b"WrongRoot", proof), (old, new, r2, r1, proof), (old, new, r1, r2, []),
              (old, new, r1, r2, proof + [b""]), (old, new, r1, r2, proof + [r1]), (old, new, r1, r2, proof + [r2]),
              (old, new, r1, r2, [b""] + proof), (old, new, r1, r2, [r1] + proof), (old, new, r1, r2, [r2] + proof),
              (old, new, r1, r2, [proof[0]] + proof), (old, new, r1, r2, proof[:-1])]
    for position in range(len(proof)):
        flipped = list(proof)
        flipped[position] = bytes([flipped[position][0] ^ 16]) + flipped[position][1:]
        probes.append((old, new, r1, r2, flipped))
    for probe in probes:
        assert not merkle.verify_consistency(*probe), probe[:2]


def test_trivial_consistency_cases_as_the_reference_takes_them():
    some, empty = b"x" * 32, ROOTS[0]
    assert merkle.verify_consistency(0, 0, some, some, [])
    assert merkle.verify_consistency(0, 1, some, b"y" * 32, [])
    assert not merkle.verify_consistency(1, 1, some, b"y" * 32, [])
    assert not merkle.verify_consistency(1, 0, some, b"y" * 32, [])
    assert not merkle.verify_consistency(1, 2, some, b"y" * 32, [])
    assert not merkle.verify_consistency(1, 1, empty, empty, [empty])


def test_every_proof_of_every_size_round_trips():
    leaves = [merkle.leaf_hash(bytes([index, index * 7 % 256])) for index in range(37)]
    for size in range(1, len(leaves) + 1):
        root = merkle.root_of(leaves[:size])
        for index in range(size):
            assert merkle.verify_inclusion(index, size, leaves[index], merkle.inclusion_proof(index, leaves[:size]), root)
        for old in range(0, size + 1):
            proof = merkle.consistency_proof(old, leaves[:size])
            assert merkle.verify_consistency(old, size, merkle.root_of(leaves[:old]), root, proof)

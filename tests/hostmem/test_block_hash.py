from hostmem.block_hash import Salts, block_hash, hash_chain, salt_for, stored_prefix

TOKENS = list(range(100, 200))


def test_salts_separate_users_and_tenants_unless_shared():
    assert salt_for("t", "alice") != salt_for("t", "bob")
    assert salt_for("t", "alice", shared=True) == salt_for("t", "bob", shared=True)
    assert salt_for("t1", "alice", shared=True) != salt_for("t2", "alice", shared=True)
    a, b = hash_chain(TOKENS, salt_for("t", "alice"), 32), hash_chain(TOKENS, salt_for("t", "bob"), 32)
    assert len(a) == 3 and not set(a) & set(b)


def test_a_partial_block_has_its_own_name():
    salt = salt_for("t", "u")
    full = hash_chain(TOKENS, salt, 32)
    assert block_hash(full[0], TOKENS[32:40], salt) not in full
    assert block_hash(full[0], bytes(memoryview(bytearray(len(TOKENS[32:64]) * 4))), salt) != full[1]


def test_stored_prefix_finds_full_blocks_then_the_longest_partial():
    salt = salt_for("t", "u")
    full = hash_chain(TOKENS, salt, 32)
    tail = block_hash(full[1], TOKENS[64:75], salt)
    stored = {full[0], full[1], tail}
    assert stored_prefix(TOKENS, salt, 32, stored.__contains__) == (75, [full[0], full[1], tail])
    assert stored_prefix(TOKENS, salt, 32, stored.__contains__, limit=70) == (64, full[:2])
    assert stored_prefix(TOKENS, salt_for("t", "v"), 32, stored.__contains__) == (0, [])
    assert stored_prefix(TOKENS, salt, 32, {full[1]}.__contains__) == (0, [])  # a gap: nothing after it


def test_a_shared_prefix_is_named_under_the_tenant_alone_and_the_rest_under_the_user():
    alice, bob = Salts.of("t", "alice", 70, 32), Salts.of("t", "bob", 70, 32)  # 2 full blocks wholly shared
    assert alice.shared_blocks == 2 and alice.is_shared(1) and not alice.is_shared(2)
    assert not alice.is_shared(0, full=False)  # a partial block is always its user's
    a, b = hash_chain(TOKENS, alice, 32), hash_chain(TOKENS, bob, 32)
    assert a[:2] == b[:2] and a[2] != b[2]  # the same tokens after the shared prefix: still private
    assert a[:2] == hash_chain(TOKENS[:64], salt_for("t", "", shared=True), 32)
    assert a[2] == block_hash(a[1], TOKENS[64:96], salt_for("t", "alice"))  # continues from the shared name
    other = hash_chain(TOKENS, Salts.of("t2", "alice", 70, 32), 32)
    assert not set(other) & set(a)  # never across tenants
    assert hash_chain(TOKENS, Salts.of("t", "alice", 0, 32), 32) == hash_chain(TOKENS, salt_for("t", "alice"), 32)


def test_stored_prefix_finds_another_users_shared_blocks_then_only_the_users_own():
    alice, bob = Salts.of("t", "alice", 64, 32), Salts.of("t", "bob", 64, 32)
    chain = hash_chain(TOKENS, alice, 32)
    tail = block_hash(chain[2], TOKENS[96:99], alice.private)
    stored = {*chain, tail}
    assert stored_prefix(TOKENS, alice, 32, stored.__contains__) == (99, [*chain, tail])
    assert stored_prefix(TOKENS, bob, 32, stored.__contains__) == (64, chain[:2])
    assert stored_prefix(TOKENS, salt_for("t", "bob"), 32, stored.__contains__) == (0, [])  # no shared prefix named
    assert stored_prefix(TOKENS, Salts.of("t2", "bob", 64, 32), 32, stored.__contains__) == (0, [])

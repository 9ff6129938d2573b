from hostmem.block_hash import block_hash, hash_chain, salt_for, stored_prefix

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

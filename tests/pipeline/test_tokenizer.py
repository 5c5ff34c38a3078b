import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hbpe.schemas.symbols import EOD, EOP, PAD, TOKEN_EOD, TOKEN_PAD

TRICKY = [
    "",
    "Hello, world!",
    "国家的发展，需要我们共同努力。",
    "emoji 🎉👩‍👩‍👧 and flags 🇺🇸",
    "combining: e\u0301 a\u0308 \u0915\u094d\u0937",
    "control \x00\x01\x1b[31m\r\n\t",
    "x" * 5000,
    "<|endoftext|> is plain text here",
    "\ufeffBOM and \u200b zero width",
]


def test_tricky_texts_round_trip(gpt2_tokenizer):
    for text in TRICKY:
        tokens, patches = gpt2_tokenizer.encode_patches(text)
        assert patches.shape == (len(tokens), 10)
        assert gpt2_tokenizer.decode_patches(patches) == text
        assert gpt2_tokenizer.decode_tokens(tokens) == text


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.text(alphabet=st.characters(codec="utf-8"), max_size=300))
def test_decode_encode_round_trip(gpt2_tokenizer, text):
    tokens, patches = gpt2_tokenizer.encode_patches(text)
    assert gpt2_tokenizer.decode_symbols(patches.reshape(-1), errors="strict") == text
    # every patch ends with EOP (or is a merged symbol that swallowed it), PAD only after it
    lengths = gpt2_tokenizer.patch_lengths[tokens.astype(np.int64)]
    assert (lengths >= 1).all() and (lengths <= 10).all()


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.binary(max_size=80))
def test_out_of_vocabulary_bytes_split_into_fitting_patches(gpt2_tokenizer, data):
    patches = gpt2_tokenizer.encode_bytes(data)
    assert all(1 <= len(p) <= gpt2_tokenizer.max_patch_size for p in patches)
    assert gpt2_tokenizer.decode_symbols_bytes(s for p in patches for s in p) == data


def test_long_run_without_spaces_splits(gpt2_tokenizer):
    word = "antidisestablishmentarianism" * 3
    patches = gpt2_tokenizer.encode_bytes(word.encode())
    assert len(patches) > 1
    assert all(len(p) <= 10 for p in patches)
    assert all(p[-1] == EOP or p[-1] >= 259 for p in patches)


def test_marker_tokens_gather_marker_patches(gpt2_tokenizer):
    rows = gpt2_tokenizer.patches(np.array([TOKEN_EOD, TOKEN_PAD], dtype=np.int32))
    assert rows[0].tolist() == [EOD] + [PAD] * 9
    assert rows[1].tolist() == [PAD] * 10


def test_split_documents_at_eod(gpt2_tokenizer):
    a, b = gpt2_tokenizer.encode("first doc"), gpt2_tokenizer.encode("second")
    stream = np.concatenate([a, [TOKEN_EOD], b, [TOKEN_EOD]]).astype(np.int32)
    p = gpt2_tokenizer.patches(stream)
    docs = gpt2_tokenizer.split_documents(p[p != PAD])
    assert docs == [b"first doc", b"second"]


def test_nbytes_counts_text_bytes_only(gpt2_tokenizer):
    text = "naïve café"
    tokens = np.concatenate([gpt2_tokenizer.encode(text), [TOKEN_EOD, TOKEN_PAD]]).astype(np.int32)
    assert gpt2_tokenizer.nbytes(tokens) == len(text.encode())


def test_encode_matches_encode_ordinary(gpt2_tokenizer, sample_texts):
    for text in [*TRICKY, sample_texts[0][:5000]]:
        assert gpt2_tokenizer.encode(text).tolist() == gpt2_tokenizer.encoding.encode_ordinary(text)

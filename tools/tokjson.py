"""Builds a real byte-level BPE tokenizer.json for tiny test models.

build(path, vocab_size, special_tokens, style, seed=0, byte_fallback=False)
    special_tokens: [(id, content), ...] written as special added tokens at the caller's ids.
    style: "deepseek" (DeepSeek V3/V4 pre_tokenizer: three isolating Splits, then ByteLevel),
           "glm" (GLM-4.5/5: one cl100k-style Split, then ByteLevel) or
           "inkling" (Inkling: one o200k-style Split, then ByteLevel).
    The 256 byte-level base tokens and merges learned from an embedded multilingual corpus fill
    the remaining ids, so every id below vocab_size exists.
    byte_fallback: instead of ByteLevel, a character-level BPE (SentencePiece-like layout): the
    base vocabulary is the 256 "<0xNN>" byte pieces plus every character of the corpus, the
    pre-tokenizer is the style's Splits alone, model.byte_fallback is on and the decoder is
    ByteFallback + Fuse; characters outside the corpus encode as their UTF-8 bytes. Test use only:
    no shipped DeepSeek/GLM file looks like this, but it exercises a reader's byte-fallback path.

The regex strings are the ones the public DeepSeek-V3/V4 and GLM-4.5/5 tokenizer.json files
ship, and tiktoken's o200k_base pattern for Inkling's o200k family (facts, not code). The merge trainer is plain BPE: count adjacent symbol pairs over the
pre-split corpus words, merge the most frequent (ties: lexicographically smallest pair), repeat.

CLI: python3 tools/tokjson.py OUT.json --vocab N --style deepseek|glm|inkling [--seed S] [--byte-fallback]
"""
import argparse
import json
import random
import unicodedata

DEEPSEEK_SPLITS = [
    "\\p{N}{1,3}",
    "[\u4e00-\u9fa5\u3040-\u309f\u30a0-\u30ff]+",
    "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+|"
    " ?[\\p{P}\\p{S}]+[\r\n]*|\\s*[\r\n]+|\\s+(?!\\S)|\\s+",
]
O200K_SPLIT = ("[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]*[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]+"
               "(?i:'s|'t|'re|'ve|'m|'ll|'d)?|[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]+"
               "[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|"
               "\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+")
GLM_SPLIT = ("(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}|"
             " ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+")

CORPUS = """\
The quick brown fox jumps over the lazy dog. It's a sunny day, isn't it? We're going out; they've left.
I'd say you'll like it: the weather's fine and the café serves crème brûlée, jalapeño tacos and naïve art.
In 2024 the population was 8,118,835 and the budget grew by 3.75% to $1,234,567.89 (up from $987,654.32).
Call +1-555-0100 or email support@example.com before 09:30 on 2025-12-31. Order #A1234 ships in 3-5 days.
Numbers: 0 1 12 123 1234 12345 123456 1234567 3.14159 2.71828 6.022e23 -42 +7 1e-9 0x1F 0b1010 100000000.
def fibonacci(n):
    if n < 2:
        return n
    return fibonacci(n - 1) + fibonacci(n - 2)

for (int i = 0; i < n; i++) {
\tsum += a[i] * b[i];  // dot product
\tif (sum > limit) { break; }
}
const result = items.filter(x => x.active).map(x => x.name.toUpperCase());
SELECT id, name FROM users WHERE age >= 18 ORDER BY name ASC LIMIT 10;
<div class="header"><a href="https://example.org/path?q=1&lang=en">Home</a></div>
{"model": "deepseek", "messages": [{"role": "user", "content": "Hello!"}], "stream": true}
Bonjour, je m'appelle Élodie et j'habite à Montréal. Où est la bibliothèque? Ça va très bien, merci.
Größe, Straße, Fußgängerübergang, Äpfel und Öl: schön, nicht wahr? Übermorgen fahren wir nach München.
¿Dónde está el niño? La señora compró piñas y mañana irá a Cádiz. ¡Qué bien!
Привет, как дела? Москва — столица России. Спасибо большое, до свидания.
Γειά σου κόσμε. Η Αθήνα είναι η πρωτεύουσα της Ελλάδας.
人工智能正在改变世界。我们今天去北京大学参观，然后吃饭。这是一个测试句子，包含中文字符。
日本語のテキストです。東京は日本の首都です。カタカナとひらがなを混ぜて書きます。ありがとうございます。
한국어 문장입니다. 서울은 대한민국의 수도입니다. 감사합니다.
مرحبا بالعالم. اللغة العربية جميلة جدا. شكرا لك.
नमस्ते दुनिया। हिंदी भाषा बहुत सुंदर है। धन्यवाद।
שלום עולם. ภาษาไทยเป็นภาษาที่สวยงาม. Tiếng Việt có dấu: xin chào các bạn.
Emoji: 😀 😂 👍 🎉 ❤️ 🚀 🇫🇷 👨‍👩‍👧‍👦 🧑🏽‍💻 ✅ ⭐ 🔥 and symbols ©®™ ± × ÷ ≤ ≥ ≠ ∞ √ π ∑ € £ ¥ → ← ↑ ↓.
Whitespace   runs,\ttabs\t\tand\r\nCRLF lines\n\n\nblank lines    and trailing spaces   
Math: x^2 + y^2 = z^2; f(x) = 3x + 2; ∫ f(x) dx; a_i * b_j; matrix[0][1] == 42 && flag != false || !done
The researchers reported that the model's accuracy improved significantly after training on more data.
Machine learning models process tokens, and tokenizers split text into pieces that the model understands.
Once upon a time, there was a little girl who lived in a village near the forest. She loved reading books.
"""


def bytes_to_unicode():
    """GPT-2's reversible byte -> printable character map used by ByteLevel."""
    keep = (list(range(ord("!"), ord("~") + 1)) + list(range(ord("\u00a1"), ord("\u00ac") + 1))
            + list(range(ord("\u00ae"), ord("\u00ff") + 1)))
    out, extra = {}, 0
    for b in range(256):
        if b in keep:
            out[b] = chr(b)
        else:
            out[b] = chr(256 + extra)
            extra += 1
    return out


def _kind(ch):
    if ch in " \t\r\n\f\v" or ch.isspace():
        return "s"
    cat = unicodedata.category(ch)
    if cat[0] in "LM":
        return "l"
    if cat[0] == "N":
        return "n"
    return "p"


def _words(text):
    """Approximate pre-split of training text (only steers which merges get learned; the
    tokenizer itself always uses the regexes written into the file)."""
    out, i = [], 0
    while i < len(text):
        k = _kind(text[i])
        j = i + 1
        if k == "s" and j < len(text) and text[i] == " " and _kind(text[j]) in "lp":
            k = _kind(text[j])
            j += 1
        limit = i + 3 if k == "n" else len(text)
        while j < len(text) and j < limit and _kind(text[j]) == k:
            j += 1
        out.append(text[i:j])
        i = j
    return out


def _extra_words(rng, n):
    """Seeded filler words (digits and letter strings) so any vocab size can be filled."""
    letters = "etaoinshrdlucmfwypvbgkjqxz"
    words = []
    for _ in range(n):
        if rng.random() < 0.3:
            words.append(str(rng.randrange(0, 1000)))
        else:
            w = "".join(rng.choice(letters) for _ in range(rng.randrange(3, 10)))
            words.append((" " if rng.random() < 0.6 else "") + w)
    return words


class _Trainer:
    """Incremental BPE: pair counts are updated only for the words a merge touches."""

    def __init__(self, symbols):
        self.symbols = symbols
        self.words, self.freq = [], []
        self.index = {}
        self.pairs, self.where = {}, {}

    def add(self, word, count=1):
        syms = self.symbols(word)
        key = tuple(syms)
        if key in self.index:
            wi = self.index[key]
            self.freq[wi] += count
            self._count(wi, count)
            return
        wi = len(self.words)
        self.index[key] = wi
        self.words.append(syms)
        self.freq.append(count)
        self._count(wi, count)

    def _count(self, wi, sign):
        syms = self.words[wi]
        for a, b in zip(syms, syms[1:]):
            p = (a, b)
            self.pairs[p] = self.pairs.get(p, 0) + sign
            self.where.setdefault(p, set()).add(wi)

    def best(self):
        best, bc = None, 0
        for p, c in self.pairs.items():
            if c > bc or (c == bc and c > 0 and p < best):
                best, bc = p, c
        return best

    def merge(self, pair):
        a, b = pair
        for wi in list(self.where.get(pair, ())):
            syms = self.words[wi]
            self._count(wi, -self.freq[wi])
            out, i = [], 0
            while i < len(syms):
                if i + 1 < len(syms) and syms[i] == a and syms[i + 1] == b:
                    out.append(a + b)
                    i += 2
                else:
                    out.append(syms[i])
                    i += 1
            self.words[wi] = out
            self._count(wi, self.freq[wi])
        self.pairs = {p: c for p, c in self.pairs.items() if c > 0}


def learn_merges(n_tokens, seed, base, symbols, reserved=()):
    """Merges until n_tokens new pieces exist. Two pairs may build the same piece (real
    vocabularies have such merges too); the later one is kept as a merge without a new id."""
    tr = _Trainer(symbols)
    for w in _words(CORPUS):
        tr.add(w)
    rng = random.Random(seed)
    for w in _extra_words(rng, 200):
        tr.add(w)
    merges, pieces, seen = [], [], set(base) | set(reserved)
    while len(pieces) < n_tokens:
        p = tr.best()
        if p is None:
            for w in _extra_words(rng, 200):
                tr.add(w)
            continue
        tr.merge(p)
        merges.append(p)
        if p[0] + p[1] not in seen:
            seen.add(p[0] + p[1])
            pieces.append(p[0] + p[1])
    return merges, pieces


def tokenizer_dict(vocab_size, special_tokens, style, seed=0, byte_fallback=False):
    if style not in ("deepseek", "glm", "inkling"):
        raise ValueError(f"unknown style {style!r} (deepseek, glm or inkling)")
    specials = sorted(special_tokens)
    taken = {i for i, _ in specials}
    if len(taken) != len(specials) or any(i < 0 or i >= vocab_size for i in taken):
        raise ValueError("special token ids must be distinct and below vocab_size")
    if byte_fallback:
        base = ["<0x%02X>" % b for b in range(256)] + sorted(set(CORPUS))
        symbols = list
    else:
        b2u = bytes_to_unicode()
        base = [b2u[b] for b in range(256)]
        symbols = lambda w: [b2u[b] for b in w.encode("utf-8")]  # noqa: E731
    n_new = vocab_size - len(specials) - len(base)
    if n_new < 1:
        raise ValueError(f"vocab_size {vocab_size} too small: need > {len(base) + len(specials)}")
    merges, pieces = learn_merges(n_new, seed, base, symbols, [c for _, c in specials])
    free = (i for i in range(vocab_size) if i not in taken)
    vocab = {}
    for piece in base + pieces:
        vocab[piece] = next(free)
    for i, content in specials:
        vocab[content] = i
    if style == "deepseek":
        normalizer = {"type": "Sequence", "normalizers": []}
        splits = DEEPSEEK_SPLITS
        # "a b" strings, as DeepSeek ships them; character-level pieces can hold spaces, so pairs
        merges_out = [[a, b] for a, b in merges] if byte_fallback else [f"{a} {b}" for a, b in merges]
    else:
        normalizer = None
        splits = [GLM_SPLIT if style == "glm" else O200K_SPLIT]
        merges_out = [[a, b] for a, b in merges]
    pre = [{"type": "Split", "pattern": {"Regex": r}, "behavior": "Isolated", "invert": False} for r in splits]
    decoder = {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True}
    if byte_fallback:
        decoder = {"type": "Sequence", "decoders": [{"type": "ByteFallback"}, {"type": "Fuse"}]}
    else:
        pre.append({"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False})
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": [{"id": i, "content": c, "single_word": False, "lstrip": False, "rstrip": False,
                          "normalized": False, "special": True} for i, c in specials],
        "normalizer": normalizer,
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": pre},
        "post_processor": None,
        "decoder": decoder,
        "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                  "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": byte_fallback,
                  "ignore_merges": False, "vocab": vocab, "merges": merges_out},
    }


def build(path, vocab_size, special_tokens, style, seed=0, byte_fallback=False):
    d = tokenizer_dict(vocab_size, special_tokens, style, seed, byte_fallback)
    with open(path, "w", encoding="utf-8") as f:
        json.dump(d, f, ensure_ascii=False, indent=1)
    return path


DEFAULT_SPECIALS = {
    "deepseek": ["<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>", "<｜User｜>", "<｜Assistant｜>",
                 "<think>", "</think>"],
    "glm": ["<|endoftext|>", "[gMASK]", "<sop>", "<|system|>", "<|user|>", "<|assistant|>",
            "<think>", "</think>"],
    "inkling": ["<|endoftext|>", "<|message_system|>", "<|message_user|>", "<|message_model|>",
                "<|content_text|>", "<|end_message|>", "<|content_model_end_sampling|>"],
}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out")
    ap.add_argument("--vocab", type=int, required=True)
    ap.add_argument("--style", choices=["deepseek", "glm", "inkling"], required=True)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--byte-fallback", action="store_true")
    a = ap.parse_args()
    specials = list(enumerate(DEFAULT_SPECIALS[a.style]))
    build(a.out, a.vocab, specials, a.style, a.seed, a.byte_fallback)


if __name__ == "__main__":
    main()

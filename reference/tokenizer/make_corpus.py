#!/usr/bin/env python3
"""Writes the tokenizer conformance corpora: tests/fixtures/tokenizer/corpus.jsonl (the Qwen3 tokenizer
as shipped) and corpus_flags.jsonl + flags_patch.json (added-token flags: lstrip, rstrip, single_word,
normalized, which the shipped Qwen3 file leaves all false).

One JSON string per line (ASCII-escaped, so U+2028, U+0085 and lone CR survive any line reader).
Deterministic: the mixed section uses a fixed seed. Rerun after editing, then regenerate the expected
ids with make_expected.mjs (JS reference), make_expected_hf_node.mjs / make_expected_hf.py (HF).

    python3 reference/tokenizer/make_corpus.py
"""
import json
import pathlib
import random

ROOT = pathlib.Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures" / "tokenizer"

LATIN = [
    "Hello world", "Hello, world!", "The quick brown fox jumps over the lazy dog.",
    "Café naïve façade Ångström", "Voilà ! L'été à Paris, c'est génial.", "Straße Größe übermäßig ÄÖÜ",
    "Zażółć gęślą jaźń", "Tiếng Việt có dấu: Người, được, những", "İstanbul ıIiİ dotted and dotless",
    "Þórður ðæ Ærø Œuvre œ", "¿Dónde está el baño? ¡Olé!", "Ça va? São Paulo, Brasil — ação",
    "ÀÁÂÃÄÅàáâãäå", "HELLO World hello WORLD hElLo", "camelCaseIdentifier snake_case_name kebab-case-name",
    "e-mail: someone@example.com, https://example.org/path?q=1&r=2#frag",
]
DECOMPOSED = [
    "Cafe\u0301", "e\u0301\u0301", "A\u030a", "\u212b ngstrom sign", "\u212a Kelvin sign", "n\u0303o",
    "\u1100\u1161\u11a8 Hangul jamo", "\u2126 ohm sign", "A\u0308\u0304", "Vie\u0302\u0323t Nam",
    "o\u0308\u0301", "\u0301 leading combining mark", "\u0338", "a\u0338", "=\u0338 not equal",
    "<\u0338 >\u0338", "\u0041\u030a\u0041\u030a\u0041\u030a", "e\u0301 vs \u00e9 vs e\u0341",
    "q\u0307\u0323 ordering", "\u0928\u093c (nukta, composition-excluded)", "\u0958 decomposes to \u0915\u093c",
    "\u1e9b\u0323", "\u00c5 vs A\u030a vs \u212b", "s\u0323\u0307 and s\u0307\u0323",
    "\uac00\u11a8 LV + T", "\u304b\u3099 \u30cf\u309a kana voicing", "\uff76\uff9e halfwidth voicing",
    "fi \ufb01 ligature (NFC keeps it)", "x\u0300\u0301\u0302\u0303\u0304\u0305\u0306\u0307\u0308",
]
SCRIPTS = [
    "Привет, мир! Как дела? Съешь же ещё этих мягких французских булок.",
    "ПРИВЕТ привет Ёлка ёжик Україна Ґ ґ Ї ї", "Γειά σου Κόσμε! Ελληνικά: αβγδεζηθ ΑΒΓΔ ς σ",
    "ἀρχῇ ἦν ὁ λόγος (polytonic)", "مرحبا بالعالم! كيف حالك؟", "اَلْعَرَبِيَّةُ مع تشكيل",
    "العدد ١٢٣٤٥ والنسبة ٪٥٠", "שלום עולם! מה שלומך?", "בְּרֵאשִׁית בָּרָא אֱלֹהִים",
    "नमस्ते दुनिया! आप कैसे हैं?", "हिन्दी में संख्या १२३४५", "สวัสดีชาวโลก ภาษาไทยไม่มีช่องว่าง",
    "안녕하세요 세계! 한국어 문장입니다.", "ㄱㄴㄷ ㅏㅑㅓ 한글 자모", "こんにちは世界！日本語の文章です。",
    "カタカナ ひらがな 漢字 ｶﾀｶﾅ ｱｲｳ", "東京都渋谷区、「引用」と『二重』。", "你好，世界！这是中文句子。",
    "繁體中文：臺灣、香港。簡體中文：台湾、香港。", "中文English混合Text测试123数字",
    "ＡＢＣ１２３　全角スペース", "ქართული ენა", "Հայերեն լեզու", "አማርኛ ቋንቋ",
    "தமிழ் மொழி", "తెలుగు భాష", "বাংলা ভাষা", "ગુજરાતી", "ਪੰਜਾਬੀ", "ಕನ್ನಡ", "മലയാളം", "සිංහල",
    "မြန်မာဘာသာ", "ភាសាខ្មែរ", "ພາສາລາວ", "བོད་སྐད་", "ᠮᠣᠩᠭᠣᠯ", "ᏣᎳᎩ", "ᚠᚢᚦᚨᚱᚲ runes",
    "𝔘𝔫𝔦𝔠𝔬𝔡𝔢 𝕄𝕒𝕥𝕙 𝐁𝐨𝐥𝐝", "𓀀𓀁 hieroglyphs", "𠀀𠀁𪚥 CJK extension B",
]
EMOJI = [
    "😀", "😀😃😄😁", "👍 👍🏻 👍🏼 👍🏽 👍🏾 👍🏿", "👨‍👩‍👧‍👦 family", "👩‍💻🧑🏿‍💻👨🏽‍🚀",
    "🏳️‍🌈 🏳️‍⚧️ 🏴‍☠️", "🇫🇷🇯🇵🇺🇸🇩🇪🇧🇷", "🇫🇷 France 🇯🇵 Japan", "❤️ ❤ ♥️ ☺️ ✔️",
    "1️⃣ 2️⃣ #️⃣ *️⃣", "🏴\U000e0067\U000e0062\U000e0073\U000e0063\U000e0074\U000e007f Scotland",
    "I ❤️ NY 🍎🗽", "emoji😀inside😀words", "🤷‍♀️🤷🏽‍♂️", "💁🏾‍♀️ 🧔🏻‍♂️ 👩🏼‍🦰", "🫠🫡🥹 newer emoji",
    "😀\u200d😀 ZWJ between faces", "👋🏽hello👋🏽", "🔥🔥🔥🔥🔥🔥🔥🔥🔥🔥",
]
CODE = [
    "def f(x):\n    return x * 2\n",
    "for (int i = 0; i < n; ++i) {\n\tsum += a[i];\n}",
    "#include <stdio.h>\nint main(void) { printf(\"%d\\n\", 42); return 0; }",
    "const x = {a: 1, \"b\": [1, 2, 3], c: null};",
    "SELECT id, name FROM users WHERE age >= 18 ORDER BY name DESC;",
    "<div class=\"x\">Hello &amp; welcome</div>",
    "if __name__ == \"__main__\":\n    main()",
    "$ ls -la | grep '^d' && echo \"done\" >> /tmp/log.txt 2>&1",
    "regex = r\"^(?P<year>\\d{4})-(?P<m>\\d{2})$\"",
    "fn main() -> Result<(), Box<dyn Error>> {\n    Ok(())\n}",
    "    indented four\n        indented eight\n\t\ttwo tabs",
    "x+=1;y-=2;z*=3;w/=4;v%=5;u**=6;t//=7",
    "a==b!=c<=d>=e&&f||g<<h>>i",
    "{\"key\": \"value\", \"n\": 1.5e-10, \"arr\": [true, false, null]}",
    "// comment\n/* block\n   comment */\n# hash comment",
    "name:\n  - item: 1\n    other: \"two\"\n  - item: 3",
    "```python\nprint('hi')\n```",
    "λx. x + 1 ∀x∈ℝ: x² ≥ 0 ∑ᵢ aᵢ",
    "path\\to\\file.txt C:\\Users\\name",
]
WHITESPACE = [
    " ", "  ", "   ", "a    b", "a b  c   d    e", "\t", "\t\t", "a\tb\t\tc", "\n", "\n\n\n",
    "a\nb", "a\n\nb", "a\r\nb", "a\r\n\r\nb", "\r", "a\rb", "\r\r\n\n", " \n ", "x \n\n y",
    "word   ", "   word", "  leading and trailing  ", "\n  \n\t\n", "end\n", "tab\tthen space \t x",
    "\u00a0nbsp\u00a0", "em\u2003space", "ideographic\u3000space", "nel\u0085char", "mongolian\u180evowel",
    "zero\u200bwidth", "\ufeffbom start", "line\u2028separator", "para\u2029separator", "vt\u000bff\u000c",
    "a \u00a0 b", "x\u2009thin\u202fnarrow", "mixed \t\n\r\n \u3000 end", "  \r\n  ", "\t\n",
    "   .", ".   ", " ! ", "!\n", "a\n\n\n\n\n\nb",
]
NUMBERS = [
    "0", "1234567890", "3.14159265358979", "1,000,000", "1.000.000,00", "-42", "+7 (495) 123-45-67",
    "0x1F 0b1010 0o777 1e10 2.5E-3", "٠١٢٣٤٥٦٧٨٩", "१२३४५", "½ ¼ ¾ ² ³ ¹", "Ⅻ ⅻ Ⅳ", "①②③",
    "2026-11-30T12:34:56Z", "v1.2.3-rc.1", "$1,234.56 €99,99 ¥1000 £5", "100%", "3x4=12",
    "12345678901234567890123456789012345678901234567890", "０１２３４５６７８９", "𝟎𝟏𝟐",
    "abc123def456", "1st 2nd 3rd 4th",
]
CONTRACTIONS = [
    "it's", "IT'S", "It'S", "don't", "DON'T", "we're", "WE'RE", "We'Re", "I've", "I'VE", "I'm", "I'M",
    "you'll", "YOU'LL", "You'Ll", "he'd", "HE'D", "'s", "'S", "'t", "'re", "'ve", "'m", "'ll", "'d",
    "'s'", "''s", "'''", "rock'n'roll", "it’s curly apostrophe", "'x 'z 'q", "'ss 'tt 'lll",
    "'\u017f long s", "'\u212a kelvin", "'\u0131 dotless", "O'Neil's cat's toy's", "y'all'd've",
    "'sHello", "' s", "s'", "isn't it's aren't", "'S'T'RE'VE'M'LL'D", "'1 '2 '!",
]
PUNCT = [
    "!!!", "?!?!", "...", "…", "—–-", "«quoted» „German“ ‚single‘", "()[]{}<>", "@#$%^&*",
    "!!!\n\n", ".\r\n", "...\n", "?!.,;:", "!@#$%^&*()_+-=[]{}|;':\",./<>?`~", "¡¿‽⸘", "。、！？「」",
    "-----", "=====", "*****", "#####", "_____", "~~~~", "|||||", "\\\\\\", "//////",
    ".,.,.,", "a.b.c", "a,b,c", "(a)", "[b]", "{c}", "\"\"", "''", "``", "→ ← ↑ ↓ ⇒", "• · ° ± × ÷",
    "™ © ® §¶", " ...", " !!!", "\t!", "!\t", "hi!!!\r\n\r\n",
]
SPECIAL = [
    "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|object_ref_start|>", "<|object_ref_end|>",
    "<|box_start|>", "<|box_end|>", "<|quad_start|>", "<|quad_end|>", "<|vision_start|>",
    "<|vision_end|>", "<|vision_pad|>", "<|image_pad|>", "<|video_pad|>", "<tool_call>", "</tool_call>",
    "<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>", "<|fim_pad|>", "<|repo_name|>",
    "<|file_sep|>", "<tool_response>", "</tool_response>", "<think>", "</think>",
    "<|endoftext|><|endoftext|>", "<|endoftext|>x", "x<|endoftext|>", "abc<|endoftext|>def",
    " <|endoftext|> ", "< |endoftext| >", "<|endoftext|", "|endoftext|>", "<|ENDOFTEXT|>",
    "<|endoftext |>", "<| endoftext|>", "<|endoftext||>", "<<|endoftext|>>", "<|<|endoftext|>|>",
    "<|fim", "<|fim_", "<|fim_prefix", "<|fim_prefix|", "fim_prefix|>", "<|box_end", "<|box_end|",
    "<|box_end|>|>", "<|box_start|><|box_end|>", "<¦fim_prefix¦>", "<¦endoftext¦>", "<¦im_start¦>user",
    "<|im_start|>user\nHello!<|im_end|>\n<|im_start|>assistant\n",
    "<|im_start|>system\nYou are helpful.<|im_end|>",
    "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>",
    "<think>\n\n</think>\n\nAnswer.", "<Think>", "< think>", "<think >", "<thinking>", "</think>x",
    "<|fim_prefix|>def add(a, b):\n<|fim_suffix|>\n    return c<|fim_middle|>",
    "<|repo_name|>kev-native<|file_sep|>src/main.cpp", "<tool_response>ok</tool_response>",
    "<|endoftext|>\u0338", "\u0338<|endoftext|>", "e<|endoftext|>\u0301", "<|im_end|>\u0301x",
    "<tool_call><tool_call>", "<tool_call", "tool_call>", "<|vision_pad|><|image_pad|><|video_pad|>",
    "\n<|endoftext|>\n", "\t<|im_start|>\t", "<|endoftext|>   spaces after", "spaces before   <|endoftext|>",
    "<|endoftext|>'s", "'<|endoftext|>s", "<|im_start|>\u00e9\u0301", "<|fim_middle|>123<|fim_suffix|>",
    "<|unknown_token|>", "<|>", "<||>", "<|a|>", "<|endoftext|>" * 5, "<|endofprompt|> <|start|>",
]
EDGE = [
    "", "a", "A", "é", "中", "😀", "'", "\"", "\\", "<", ">", "|", "¦", "Ġ", "Ċ", "ĠĠ", "ĉ",
    "\u0000", "a\u0000b", "\u0001\u0002\u0003", "\u007f", "\u0080\u0081\u009f", "\u00ad soft hyphen",
    "\ue000 private use", "\U000f0000 plane-15 PUA", "\ufffd replacement", "\ufffe\uffff nonchar",
    "\U0010ffff max code point", "\u200c\u200d ZWNJ ZWJ", "\u202e RLO \u202c", "\u2060 word joiner",
    "\U0001f3fb lone skin tone", "\ufe0f lone VS16", "\u20e3 lone keycap",
]

# Where regex engines disagree on \s, case folding or Unicode versions (Oniguruma in HF, PCRE2 here, V8 in
# the JS port): U+FEFF, U+0085, U+180E, U+1680, long s and Kelvin sign under (?i:'s), dotless i, letters
# added in Unicode 15 (CJK Ext H U+31350, Nag Mundari U+1E4D0, Kawi U+11F04), Nl/No numbers, tatweel, ZWJ.
PROBES = [
    "a\ufeff\ufeffb", "x\ufeff!", "a\u0085\u0085b", "x\u0085!", "x\u180e!", "a\u180e\u180eb", "'\u017fhello",
    "'\u212ahello", "'\u017fx'\u017f", "'Ss", "'\u0131d", "x\u1680!", "a\u2028\u2028b", "\u3000\u3000x",
    "a\u00a0\u00a0b", "\U00020000x", "a\U00031350", "\U00031350\U00031351 x", "a\U0001e4d0",
    "\U00011f04\U00011f05", "x\u0640y", "1\u00b2\u00b3", "\u2160\u2161 x", "a\u200db", "abc\u0301def",
    "\u0301\u0301", "'\u0301s", "'s\u0301", "<|endoftext|>\u0338x",
]

LONG = [
    ("Lorem ipsum dolor sit amet, consectetur adipiscing elit, sed do eiusmod tempor incididunt ut "
     "labore et dolore magna aliqua. ") * 30,
    " " * 2000,
    "a" + " " * 1500 + "b",
    "\n" * 500 + "x" + "\t" * 500,
    "这是一个很长的中文段落，用来测试长文本的分词效果。" * 60,
    "a" * 3000,
    "abcdefghij" * 400,
    "1234567890" * 200,
    "😀" * 600,
    "👨‍👩‍👧‍👦" * 150,
    "Привет мир " * 200,
    "<|endoftext|> text between " * 100,
    "e\u0301" * 800,
    "!?" * 1000,
    ("def function_name(argument_one, argument_two):\n    result = argument_one + argument_two\n"
     "    return result\n\n") * 25,
    "The year 2026 had 365 days; 12 months; 52 weeks. " * 60,
]

FRAGMENT_POOLS = [LATIN, DECOMPOSED, SCRIPTS, EMOJI, CODE, WHITESPACE, NUMBERS, CONTRACTIONS, PUNCT, SPECIAL]
JOINERS = ["", " ", "  ", "\n", "\t", "\r\n", "\u3000", "-", "'", "'s "]


def mixed(count, seed=20261130):
    rng = random.Random(seed)
    out = []
    for _ in range(count):
        parts = [rng.choice(rng.choice(FRAGMENT_POOLS)) for _ in range(rng.randint(2, 6))]
        text = parts[0]
        for p in parts[1:]:
            text += rng.choice(JOINERS) + p
        out.append(text)
    return out


# Flag changes applied to the Qwen3 added tokens, and extra added tokens (ids continue after the file's
# last one, as HF assigns them). "\u212b" is normalized=true, so it is matched after NFC, as U+00C5.
FLAGS_PATCH = {
    "modify": {
        "<|im_start|>": {"lstrip": True},
        "<|im_end|>": {"rstrip": True},
        "<think>": {"single_word": True},
        "</think>": {"single_word": True, "lstrip": True, "rstrip": True},
        "<tool_call>": {"normalized": True},
    },
    "add": [
        {"id": 151669, "content": "\u212b", "single_word": False, "lstrip": False, "rstrip": False,
         "normalized": True, "special": False},
        {"id": 151670, "content": "hello world", "single_word": True, "lstrip": False, "rstrip": False,
         "normalized": False, "special": False},
        {"id": 151671, "content": "<|im", "single_word": False, "lstrip": False, "rstrip": False,
         "normalized": False, "special": True},
        {"id": 151672, "content": "caf\u00e9", "single_word": False, "lstrip": True, "rstrip": True,
         "normalized": True, "special": False},
    ],
}
FLAGS_CORPUS = [
    "Hello <|im_start|>user", "Hello   \t<|im_start|>", "\u3000<|im_start|>", "<|im_start|>", " <|im_start|>",
    "a\u0085<|im_start|>", "a\u180e<|im_start|>", "a\u00a0\u2003<|im_start|>x",
    "<|im_end|>  \n next", "<|im_end|>\u00a0x", "<|im_end|>", "<|im_end|> <|im_start|>", "<|im_end|>   ",
    "<think>", "x<think>", "<think>x", " <think> ", "\u00e9<think>", "1<think>", "_<think>", "-<think>-",
    "\u0301<think>", "\u24b6<think>", "<think>\u24b6", "\U0001f600<think>\U0001f600", "<think><think>",
    "a <think> b", "\u0661<think>", "\u00b2<think>", "\u2160<think>", "\u200d<think>", "\u203f<think>",
    "foo  </think>  bar", "foo</think>bar", "  </think>  ", "foo </think>bar", "\t</think>\n",
    "<tool_call>x", "<|im_end|><tool_call>", "a<tool_call>b", "<tool_call>\u0338",
    "\u212b", "A\u030a", "\u00c5", "x\u212by", "<|im_start|>A\u030a", "\u212b\u212b",
    "say hello world now", "sayhello world", "hello worlds", "hello world", "hello world!", "(hello world)",
    "<|im", "<|im_x|>", "<|im_start", "<|im<|im_start|>", "<|imx",
    "un caf\u00e9 noir", "cafe\u0301", "un  cafe\u0301  noir", "caf\u00e9caf\u00e9", "<|im_end|> caf\u00e9 x",
    "", "plain text without added tokens",
]


def write_jsonl(path, strings):
    with open(path, "w", encoding="ascii", newline="\n") as f:
        for s in strings:
            f.write(json.dumps(s, ensure_ascii=True) + "\n")
    print(f"wrote {len(strings)} strings to {path}")


def main():
    lines = LATIN + DECOMPOSED + SCRIPTS + EMOJI + CODE + WHITESPACE + NUMBERS + CONTRACTIONS + PUNCT
    lines += SPECIAL + EDGE + PROBES + LONG + mixed(80)
    seen = set()
    unique = [s for s in lines if not (s in seen or seen.add(s))]
    FIXTURES.mkdir(parents=True, exist_ok=True)
    write_jsonl(FIXTURES / "corpus.jsonl", unique)
    write_jsonl(FIXTURES / "corpus_flags.jsonl", FLAGS_CORPUS)
    with open(FIXTURES / "flags_patch.json", "w", encoding="ascii", newline="\n") as f:
        json.dump(FLAGS_PATCH, f, ensure_ascii=True, indent=2)
        f.write("\n")


if __name__ == "__main__":
    main()

// Writes tests/data/tokenizer/strings.json: a deterministic corpus of strings that exercise
// tokenizer edge cases (code, whitespace runs, numbers, scripts, emoji, combining marks,
// contractions, inline special tokens, long words). Run: node tools/tokenizer_oracle/make_corpus.mjs
import fs from "node:fs";
import path from "node:path";
import { fileURLToPath } from "node:url";

const repo = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "../..");
const out = path.join(repo, "tests/data/tokenizer/strings.json");

// mulberry32: small deterministic PRNG.
let seed = 0x5eed1234;
function rand() {
  seed = (seed + 0x6d2b79f5) >>> 0;
  let t = seed;
  t = Math.imul(t ^ (t >>> 15), t | 1);
  t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
  return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
}
const pick = (xs) => xs[Math.floor(rand() * xs.length)];
const int = (lo, hi) => lo + Math.floor(rand() * (hi - lo + 1));

const fixed = [
  "",
  "Hello world",
  "Hello world! It's 2025: naïve café 😀 —  \n\n  def f(x): return x**2",
  "Tom had a red",
  "The little dog",
  "Once upon a time, a cat",
  "naïve café 😀 x",
  " ", "  ", "   ", "    ", "\t", "\n", "\r\n", "\n\n", "\r", " \n", "\n ", " \r\n ", "\t\t\t",
  "a b", "a  b", "a   b", "a\tb", "a\t\tb", "a\nb", "a\n\nb", "a\r\nb", "a \n b", "a\r\n\r\nb",
  "trailing space ", "trailing spaces   ", " leading space", "   leading spaces",
  "line one\nline two\n", "crlf line\r\nnext\r\n", "tab\tseparated\tvalues\n1\t2\t3",
  "mixed \t \n \r\n whitespace", "\u00a0nbsp\u00a0here", "ideographic\u3000space", "en\u2002space",
  "zero\u200bwidth", "line\u2028separator", "vertical\u000btab", "form\u000cfeed", "next\u0085line",
  "bom\ufeffinside",
  "I'm here", "I'M HERE", "don't", "DON'T", "Don'T", "they're", "THEY'RE", "we've", "WE'VE",
  "he'll", "HE'LL", "she'd", "SHE'D", "it's", "IT'S", "It'S", "the dog's bone", "THE DOG'S BONE",
  "'s 't 're 've 'm 'll 'd", "'S 'T 'RE 'VE 'M 'LL 'D", "rock 'n' roll", "''quoted''",
  "0", "7", "42", "123", "1234", "12345", "123456", "1234567", "12345678", "123456789",
  "1234567890", "12345678901234567890", "3.14159", "-273.15", "1e-10", "6.022e23", "1,000,000",
  "0x1F600", "0b101010", "v1.2.3", "2025-01-31T12:34:56Z", "+1 (555) 123-4567", "$19.99", "50%",
  "١٢٣٤٥", "४२", "一二三", "Ⅻ", "½ ¾", "①②③",
  "def f(x):\n    return x ** 2\n",
  "class Foo:\n    def __init__(self, a: int = 0) -> None:\n        self.a = a\n",
  "for i in range(10):\n\tprint(f\"{i:>4}\")\n",
  "#include <vector>\nint main() {\n  std::vector<int> v{1, 2, 3};\n  return v.size();\n}\n",
  "template <typename T>\nconstexpr T sq(T x) noexcept { return x * x; }",
  "fn main() {\n    let v: Vec<u32> = (0..10).map(|x| x * 2).collect();\n    println!(\"{:?}\", v);\n}",
  "const f = async (a, b) => { await g(a ?? b); return a?.b || [...c]; };",
  "func main() {\n\tfmt.Println(\"hello\")\n}\n",
  "SELECT id, name FROM users WHERE age >= 18 ORDER BY name DESC LIMIT 10;",
  "#!/bin/bash\nset -euo pipefail\nfor f in *.txt; do echo \"$f\"; done\n",
  "<html><body><p class=\"x\">Hi &amp; bye</p></body></html>",
  "{\"key\": [1, 2.5, null, true], \"nested\": {\"a\": \"b\"}}",
  "x = a+b-c*d/e%f; y += 1; z <<= 2; w != q && r || !s",
  "if (a==b) {{ return; }} // comment /* block */",
  "https://example.com/path?query=1&x=y#frag", "user.name+tag@example.co.uk",
  "!!!???...", "—", "–", "…", "«guillemets»", "“smart quotes”", "‘single’", "¿Qué? ¡Sí!",
  "∀x ∈ ℝ: x² ≥ 0", "E = mc²", "∑_{i=1}^{n} i = n(n+1)/2", "α β γ δ ε", "→ ← ↑ ↓ ⇒",
  "你好，世界！", "我爱自然语言处理。", "日本語のテキストです。", "カタカナとひらがな", "한국어 텍스트입니다.",
  "مرحبا بالعالم", "السلام عليكم ورحمة الله", "नमस्ते दुनिया", "हिन्दी में लिखा गया पाठ", "שלום עולם",
  "Привет, мир!", "Γειά σου Κόσμε", "สวัสดีชาวโลก", "Xin chào thế giới", "Ελληνικά και English",
  "😀", "😀😀😀", "👍🏽", "👨‍👩‍👧‍👦", "👩🏾‍💻", "🏳️‍🌈", "🇺🇸🇯🇵🇫🇷", "1️⃣2️⃣", "❤️", "🤖 robots 🤖",
  "e\u0301", "caf\u00e9", "cafe\u0301", "n\u0303", "\u00f1", "A\u030a", "\u00c5", "\u212b",
  "\u1100\u1161\u11a8", "\uac01", "o\u0308\u0304", "q\u0307\u0323", "\u1e0b\u0323", "ḍ̇",
  "Ǆ ǅ ǆ", "ﬁ ligature", "Ａｂｃ fullwidth", "ｶﾀｶﾅ halfwidth",
  "Pneumonoultramicroscopicsilicovolcanoconiosis",
  "Supercalifragilisticexpialidocious".repeat(5),
  "a".repeat(300), " ".repeat(50), "\n".repeat(20), "ab".repeat(200), "9".repeat(100),
  "汉".repeat(100), "😀".repeat(40),
  "<|im_start|>user\nhi<|im_end|>",
  "<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>user\nHi!<|im_end|>\n<|im_start|>assistant\n",
  "<think>\n\n</think>\n\nThe answer is 4.", "<|endoftext|>", "text<|endoftext|>more text",
  "<|im_end|><|im_end|>", "<<|im_end|>>", "<|im_start", "im_start|>", "<|im_start|> spaced <|im_end|> ",
  "<tool_call>\n{\"name\": \"f\", \"arguments\": {}}\n</tool_call>", "<|fim_prefix|>a<|fim_suffix|>b<|fim_middle|>",
  "<s>", "</s>", "<unk>", "<s>Hello</s>", " <s> spaced </s> ", "<s><s></s>", "<0x41>", "▁", "▁▁x", "x▁y",
];

const words = ["the", "quick", "brown", "fox", "jumps", "over", "lazy", "dog", "Once", "upon",
  "a", "time", "little", "girl", "named", "Lily", "She", "loved", "play", "park", "big", "red",
  "ball", "tokenizer", "inference", "speculative", "decoding", "GPU", "kernel", "Hello", "World",
  "don't", "it's", "THEY'RE", "can't", "HTTP", "JSON", "naïve", "café", "résumé", "Zürich",
  "coöperate", "façade", "São", "Paulo", "Ærøskøbing", "straße", "İstanbul"];
const code = ["def", "return", "if", "else", "for", "while", "x", "y", "i++", "==", "!=", "=>",
  "->", "::", "{", "}", "(", ")", "[", "]", ";", "//", "/*", "*/", "#", "@", "$", "%", "^", "&",
  "*", "+", "-", "=", "<", ">", "<=", ">=", "&&", "||", "\"str\"", "'c'", "`tpl`", "\\n", "0x7f",
  "std::vector<int>", "self.x", "async", "await", "None", "nullptr", "True", "fn", "let mut"];
const scripts = ["你好", "世界", "中文", "東京", "ありがとう", "コンピュータ", "사랑해", "서울",
  "مرحبا", "كتاب", "नमस्ते", "भारत", "שלום", "Привет", "мир", "Ελλάδα", "ไทย", "Tiếng Việt",
  "ქართული", "Հայերեն", "বাংলা", "தமிழ்", "ગુજરાતી"];
const emoji = ["😀", "😂", "🥲", "👍", "👍🏻", "👍🏿", "👨‍💻", "👩‍👩‍👦", "🧑‍🤝‍🧑", "🇩🇪", "🇧🇷",
  "🏴‍☠️", "✨", "🔥", "💯", "🚀", "☕", "⚽", "♥️", "#️⃣", "🫠"];
const marks = ["e\u0301", "a\u0300", "o\u0302", "u\u0308", "c\u0327", "n\u0303", "i\u0307\u0301",
  "\u0915\u093c", "\u1100\u1161", "x\u0336", "\u05d1\u05bc"];
const seps = [" ", " ", " ", "", "\n", "  ", "\t", ", ", ". ", "\r\n", " \n ", "   ", "\n\n",
  ": ", "-", "_", "/", " — "];

function number() {
  const len = int(1, 24);
  let s = String(int(1, 9));
  for (let i = 1; i < len; ++i) s += String(int(0, 9));
  const r = rand();
  if (r < 0.2) return s.slice(0, Math.ceil(len / 2)) + "." + s.slice(Math.ceil(len / 2));
  if (r < 0.3) return "-" + s;
  if (r < 0.4) return Number(s.slice(0, 9)).toLocaleString("en-US");
  return s;
}
function fragment() {
  const r = rand();
  if (r < 0.30) return pick(words);
  if (r < 0.45) return pick(code);
  if (r < 0.57) return pick(scripts);
  if (r < 0.67) return number();
  if (r < 0.75) return pick(emoji);
  if (r < 0.82) return pick(marks);
  if (r < 0.86) return pick(words).toUpperCase();
  if (r < 0.89) return pick(["<|im_start|>", "<|im_end|>", "<think>", "</think>", "<s>", "</s>",
    "<|endoftext|>"]);
  if (r < 0.92) return pick(words) + "'" + pick(["s", "S", "t", "T", "re", "RE", "ll", "d", "ve", "M"]);
  if (r < 0.95) return pick(seps).repeat(int(2, 6));
  return String.fromCodePoint(...Array.from({ length: int(3, 12) }, () => int(0x61, 0x7a)));
}

const corpus = [...fixed];
while (corpus.length < 560) {
  const n = int(1, 14);
  let s = "";
  for (let i = 0; i < n; ++i) s += (i > 0 ? pick(seps) : "") + fragment();
  if (rand() < 0.1) s = pick(seps) + s;
  if (rand() < 0.1) s += pick(seps);
  corpus.push(s);
}
// A few long mixed documents.
for (let k = 0; k < 6; ++k) {
  let s = "";
  for (let i = 0; i < 250; ++i) s += (i > 0 ? pick(seps) : "") + fragment();
  corpus.push(s);
}
fs.mkdirSync(path.dirname(out), { recursive: true });
fs.writeFileSync(out, JSON.stringify(corpus, null, 0).replace(/","/g, "\",\n\"") + "\n");
console.log(`wrote ${corpus.length} strings to ${path.relative(repo, out)}`);

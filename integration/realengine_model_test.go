package integration

// The model the real-engine tests serve: a tiny llama (hidden 128, 4
// layers, 4 heads, 2 KV heads, FFN 384, vocabulary 1024, context 4096;
// 1.05 M parameters, 2.1 MB in F16) with random weights, written as a GGUF
// file that Ollama's llama.cpp runner loads like any other. Its text is
// gibberish made of English word pieces, but everything around it (HTTP,
// prefill, KV-cache reuse, queueing) is the real engine's. Ported from the
// stdlib-only Python maker of the project's realup notes.

import (
	"bytes"
	"encoding/binary"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// tinyModel is the shape and behaviour of the model written.
type tinyModel struct {
	hidden, layers, heads, kvHeads, ffn, vocab, ctx int
	numPredict, threads                             int
	repeatPenalty                                   float64
	// eosBias is the logit bias of <|im_end|>: 2.5 ends replies after ~70
	// tokens, -60 never (a reply always runs to max_tokens).
	eosBias float32
	seed    uint64
}

func defaultTinyModel() tinyModel {
	// One compute thread: ggml's CPU threads spin on barriers, so two busy
	// runners with two threads each on a two-core machine slow to a crawl.
	// repeat_penalty 1.3: random weights love to repeat a token, and Ollama
	// cuts a reply after 30 identical tokens in a row.
	return tinyModel{hidden: 128, layers: 4, heads: 4, kvHeads: 2, ffn: 384, vocab: 1024, ctx: 4096,
		numPredict: 256, threads: 1, repeatPenalty: 1.3, eosBias: 2.5, seed: 1234}
}

// tinyWords is the corpus the tokenizer's merges are learnt from (common
// English words first: their rank sets their frequency).
const tinyWords = `the of and to a in is it you that he was for on are with as I his they be at
one have this from or had by hot word but what some we can out other were all there
when up use your how said an each she which do their time if will way about many then
them write would like so these her long make thing see him two has look more day could
go come did number sound no most people my over know water than call first who may down
side been now find any new work part take get place made live where after back little
only round man year came show every good me give our under name very through just form
sentence great think say help low line differ turn cause much mean before move right boy
old too same tell does set three want air well also play small end put home read hand
port large spell add even land here must big high such follow act why ask men change went
light kind off need house picture try us again animal point mother world near build self
earth father head stand own page should country found answer school grow study still learn
plant cover food sun four between state keep eye never last let thought city tree cross
farm hard start might story saw far sea draw left late run while press close night real
life few north open seem together next white children begin got walk example ease paper
group always music those both mark often letter until mile river car feet care second book
carry took science eat room friend began idea fish mountain stop once base hear horse cut
sure watch color face wood main enough plain girl usual young ready above ever red list
though feel talk bird soon body dog family direct pose leave song measure door product
black short numeral class wind question happen complete ship area half rock order fire
south problem piece told knew pass since top whole king space heard best hour better true
during hundred five remember step early hold west ground interest reach fast verb sing
listen six table travel less morning ten simple several vowel toward war lay against
pattern slow center love person money serve appear road map rain rule govern pull cold
notice voice unit power town fine certain fly fall lead cry dark machine note wait plan
figure star box noun field rest correct able pound done beauty drive stood contain front
teach week final gave green oh quick develop ocean warm free minute strong special mind
behind clear tail produce fact street inch multiply nothing course stay wheel full force
blue object decide surface deep moon island foot system busy test record boat common gold
possible plane stead dry wonder laugh thousand ago ran check game shape equate miss brought
heat snow tire bring yes distant fill east paint language among router server token model
request response stream cache queue`

var tinySpecials = []string{"<|endoftext|>", "<|im_start|>", "<|im_end|>"}

// gpt2ByteChars is GPT-2's reversible byte → printable rune mapping, which
// a byte-level BPE vocabulary is written in.
func gpt2ByteChars() [256]string {
	var out [256]string
	keep := func(b int) bool { return b >= '!' && b <= '~' || b >= 0xa1 && b <= 0xac || b >= 0xae && b <= 0xff }
	n := 0
	for b := 0; b < 256; b++ {
		if keep(b) {
			out[b] = string(rune(b))
		} else {
			out[b] = string(rune(256 + n))
			n++
		}
	}
	return out
}

// tinyTokenizer learns BPE merges over tinyWords until the vocabulary
// (256 bytes, the merged pieces, then the three specials) has vocab
// entries. It returns the tokens, their types (1 normal, 3 control) and
// the merges.
func tinyTokenizer(vocab int) (tokens []string, types []int32, merges []string) {
	b2u := gpt2ByteChars()
	tokens = b2u[:]
	tokens = append([]string(nil), tokens...)
	// Word frequencies (Zipf): " word" dominates, plus a capitalised
	// sentence start and a little punctuation.
	counts := map[string]int{}
	var order []string // first-seen order, so the learning is deterministic
	words := strings.Fields(tinyWords)
	for rank, w := range words {
		f := 10000/(rank+10) + 1
		for _, fm := range []struct {
			form string
			mult int
		}{{" " + w, 4}, {strings.ToUpper(w[:1]) + strings.ToLower(w[1:]), 1}, {" " + w + ".", 1}, {" " + w + ",", 1}} {
			var syms []string
			for _, c := range []byte(fm.form) {
				syms = append(syms, b2u[c])
			}
			key := strings.Join(syms, "\x00")
			if _, ok := counts[key]; !ok {
				order = append(order, key)
			}
			counts[key] += f * fm.mult
		}
	}
	type word struct {
		syms []string
		n    int
	}
	corpus := make([]word, 0, len(order))
	for _, k := range order {
		corpus = append(corpus, word{strings.Split(k, "\x00"), counts[k]})
	}
	have := map[string]bool{}
	for _, t := range tokens {
		have[t] = true
	}
	type pair struct{ a, b string }
	for len(tokens) < vocab-len(tinySpecials) {
		pairs := map[pair]int{}
		for _, w := range corpus {
			for i := 0; i+1 < len(w.syms); i++ {
				pairs[pair{w.syms[i], w.syms[i+1]}] += w.n
			}
		}
		if len(pairs) == 0 {
			break
		}
		var best pair
		bestN := -1
		for p, n := range pairs { // highest count, then the greatest pair
			if n > bestN || n == bestN && (p.a > best.a || p.a == best.a && p.b > best.b) {
				best, bestN = p, n
			}
		}
		merged := best.a + best.b
		merges = append(merges, best.a+" "+best.b)
		if !have[merged] {
			tokens = append(tokens, merged)
			have[merged] = true
		}
		for i, w := range corpus {
			out := w.syms[:0:0]
			for j := 0; j < len(w.syms); j++ {
				if j+1 < len(w.syms) && w.syms[j] == best.a && w.syms[j+1] == best.b {
					out = append(out, merged)
					j++
				} else {
					out = append(out, w.syms[j])
				}
			}
			corpus[i].syms = out
		}
	}
	types = make([]int32, len(tokens), len(tokens)+len(tinySpecials))
	for i := range types {
		types[i] = 1
	}
	for _, s := range tinySpecials {
		tokens = append(tokens, s)
		types = append(types, 3)
	}
	return tokens, types, merges
}

// gguf builds a GGUF v3 file: metadata, tensor infos, aligned tensor data.
type gguf struct {
	kv     bytes.Buffer
	nKV    int
	names  []string
	shapes [][]uint64
	kinds  []uint32 // 0 F32, 1 F16
	datas  [][]byte
}

const (
	ggufU32, ggufI32, ggufF32, ggufBool, ggufStr, ggufArr = 4, 5, 6, 7, 8, 9
	ggufAlign                                             = 32
)

func (g *gguf) str(b *bytes.Buffer, s string) {
	_ = binary.Write(b, binary.LittleEndian, uint64(len(s)))
	b.WriteString(s)
}

func (g *gguf) key(k string, typ uint32) {
	g.str(&g.kv, k)
	_ = binary.Write(&g.kv, binary.LittleEndian, typ)
	g.nKV++
}

func (g *gguf) putStr(k, v string) { g.key(k, ggufStr); g.str(&g.kv, v) }
func (g *gguf) putU32(k string, v int) {
	g.key(k, ggufU32)
	_ = binary.Write(&g.kv, binary.LittleEndian, uint32(v))
}
func (g *gguf) putF32(k string, v float32) {
	g.key(k, ggufF32)
	_ = binary.Write(&g.kv, binary.LittleEndian, v)
}
func (g *gguf) putBool(k string, v bool) {
	g.key(k, ggufBool)
	_ = binary.Write(&g.kv, binary.LittleEndian, v)
}

func (g *gguf) putStrs(k string, vs []string) {
	g.key(k, ggufArr)
	_ = binary.Write(&g.kv, binary.LittleEndian, uint32(ggufStr))
	_ = binary.Write(&g.kv, binary.LittleEndian, uint64(len(vs)))
	for _, v := range vs {
		g.str(&g.kv, v)
	}
}

func (g *gguf) putI32s(k string, vs []int32) {
	g.key(k, ggufArr)
	_ = binary.Write(&g.kv, binary.LittleEndian, uint32(ggufI32))
	_ = binary.Write(&g.kv, binary.LittleEndian, uint64(len(vs)))
	_ = binary.Write(&g.kv, binary.LittleEndian, vs)
}

// tensor adds a tensor; 2-D ones are stored as F16, others as F32 (what
// llama.cpp's norms expect).
func (g *gguf) tensor(name string, data []float32, shape ...uint64) {
	var b bytes.Buffer
	kind := uint32(0)
	if len(shape) == 2 {
		kind = 1
		for _, f := range data {
			_ = binary.Write(&b, binary.LittleEndian, float16(f))
		}
	} else {
		_ = binary.Write(&b, binary.LittleEndian, data)
	}
	g.names, g.shapes, g.kinds, g.datas = append(g.names, name), append(g.shapes, shape), append(g.kinds, kind), append(g.datas, b.Bytes())
}

func (g *gguf) bytes() []byte {
	var out bytes.Buffer
	out.WriteString("GGUF")
	_ = binary.Write(&out, binary.LittleEndian, uint32(3))
	_ = binary.Write(&out, binary.LittleEndian, uint64(len(g.names)))
	_ = binary.Write(&out, binary.LittleEndian, uint64(g.nKV))
	out.Write(g.kv.Bytes())
	pad := func(n int) int { return (ggufAlign - n%ggufAlign) % ggufAlign }
	offset := uint64(0)
	for i, name := range g.names {
		g.str(&out, name)
		_ = binary.Write(&out, binary.LittleEndian, uint32(len(g.shapes[i])))
		_ = binary.Write(&out, binary.LittleEndian, g.shapes[i])
		_ = binary.Write(&out, binary.LittleEndian, g.kinds[i])
		_ = binary.Write(&out, binary.LittleEndian, offset)
		offset += uint64(len(g.datas[i]) + pad(len(g.datas[i])))
	}
	out.Write(make([]byte, pad(out.Len())))
	for _, d := range g.datas {
		out.Write(d)
		out.Write(make([]byte, pad(len(d))))
	}
	return out.Bytes()
}

// float16 converts f to IEEE half precision, rounding to nearest even.
func float16(f float32) uint16 {
	b := math.Float32bits(f)
	sign := uint16(b>>16) & 0x8000
	exp := int(b>>23&0xff) - 127 + 15
	mant := b & 0x7fffff
	switch {
	case exp >= 31:
		return sign | 0x7c00
	case exp <= 0:
		if exp < -10 {
			return sign
		}
		mant |= 0x800000
		shift := uint(14 - exp)
		h := mant >> shift
		rem, half := mant&(1<<shift-1), uint32(1)<<(shift-1)
		if rem > half || rem == half && h&1 == 1 {
			h++
		}
		return sign | uint16(h)
	}
	h := uint32(exp)<<10 | mant>>13
	if rem := mant & 0x1fff; rem > 0x1000 || rem == 0x1000 && h&1 == 1 {
		h++ // a carry into the exponent is still right
	}
	return sign | uint16(h)
}

// write writes dir/tiny.gguf and dir/Modelfile (from
// realup/Modelfile.tmpl) and returns the Modelfile's path.
func (m tinyModel) write(t testing.TB, dir string) string {
	t.Helper()
	n, heads, kv, ffn := m.hidden, m.heads, m.kvHeads, m.ffn
	hd := n / heads
	rng := rand.New(rand.NewPCG(m.seed, 0))
	tokens, types, merges := tinyTokenizer(m.vocab)
	V := len(tokens)
	index := func(s string) int {
		for i, tok := range tokens {
			if tok == s {
				return i
			}
		}
		t.Fatalf("token %q missing", s)
		return -1
	}
	eos, bos := index("<|im_end|>"), index("<|endoftext|>")
	random := func(count int, std float64) []float32 {
		out := make([]float32, count)
		for i := range out {
			out[i] = float32(rng.NormFloat64() * std)
		}
		return out
	}

	var g gguf
	// Output steering: residual dimension 0 carries a constant (set in
	// every embedding row, never written by a layer, masked out of every
	// norm), so column 0 of output.weight acts as a per-token logit bias:
	// non-printable bytes and the other specials can never be sampled.
	const carried = 4.0
	emb := random(n*V, 1)
	for tok := 0; tok < V; tok++ {
		emb[tok*n] = carried
	}
	g.tensor("token_embd.weight", emb, uint64(n), uint64(V))
	masked := make([]float32, n)
	for i := 1; i < n; i++ {
		masked[i] = 1
	}
	for l := 0; l < m.layers; l++ {
		p := "blk." + strconv.Itoa(l) + "."
		g.tensor(p+"attn_norm.weight", masked, uint64(n))
		g.tensor(p+"attn_q.weight", random(n*heads*hd, 1/math.Sqrt(float64(n))), uint64(n), uint64(heads*hd))
		g.tensor(p+"attn_k.weight", random(n*kv*hd, 1/math.Sqrt(float64(n))), uint64(n), uint64(kv*hd))
		g.tensor(p+"attn_v.weight", random(n*kv*hd, 1/math.Sqrt(float64(n))), uint64(n), uint64(kv*hd))
		wo := random(heads*hd*n, 0.5/math.Sqrt(float64(heads*hd)))
		clear(wo[:heads*hd]) // output dimension 0 stays the constant
		g.tensor(p+"attn_output.weight", wo, uint64(heads*hd), uint64(n))
		g.tensor(p+"ffn_norm.weight", masked, uint64(n))
		g.tensor(p+"ffn_gate.weight", random(n*ffn, 1/math.Sqrt(float64(n))), uint64(n), uint64(ffn))
		g.tensor(p+"ffn_up.weight", random(n*ffn, 1/math.Sqrt(float64(n))), uint64(n), uint64(ffn))
		wd := random(ffn*n, 0.5/math.Sqrt(float64(ffn)))
		clear(wd[:ffn])
		g.tensor(p+"ffn_down.weight", wd, uint64(ffn), uint64(n))
	}
	ones := make([]float32, n)
	for i := range ones {
		ones[i] = 1
	}
	g.tensor("output_norm.weight", ones, uint64(n))
	const h0 = 2.5 // dimension 0 after the final norm, about C / rms
	out := random(n*V, 2/math.Sqrt(float64(n)))
	for tok := 0; tok < V; tok++ {
		var bias float32
		switch {
		case tok == eos:
			bias = m.eosBias
		case types[tok] == 3:
			bias = -60
		case tok < 256 && tok >= 32 && tok < 127:
			bias = 0
		case tok == '\n':
			bias = -3
		case tok < 256:
			bias = -60
		default:
			bias = 1
		}
		out[tok*n] = bias / h0
	}
	g.tensor("output.weight", out, uint64(n), uint64(V))

	const arch = "llama"
	g.putStr("general.architecture", arch)
	g.putStr("general.name", "tiny-random-llama")
	g.putU32("general.file_type", 1) // mostly F16
	g.putU32("general.alignment", ggufAlign)
	g.putU32(arch+".context_length", m.ctx)
	g.putU32(arch+".embedding_length", n)
	g.putU32(arch+".block_count", m.layers)
	g.putU32(arch+".feed_forward_length", ffn)
	g.putU32(arch+".attention.head_count", heads)
	g.putU32(arch+".attention.head_count_kv", kv)
	g.putF32(arch+".attention.layer_norm_rms_epsilon", 1e-5)
	g.putU32(arch+".rope.dimension_count", hd)
	g.putF32(arch+".rope.freq_base", 10000)
	g.putU32(arch+".vocab_size", V)
	g.putStr("tokenizer.ggml.model", "gpt2")
	g.putStr("tokenizer.ggml.pre", "default")
	g.putStrs("tokenizer.ggml.tokens", tokens)
	g.putI32s("tokenizer.ggml.token_type", types)
	g.putStrs("tokenizer.ggml.merges", merges)
	g.putU32("tokenizer.ggml.bos_token_id", bos)
	g.putU32("tokenizer.ggml.eos_token_id", eos)
	g.putU32("tokenizer.ggml.padding_token_id", bos)
	g.putBool("tokenizer.ggml.add_bos_token", false)
	g.putStr("tokenizer.chat_template", "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n'}}"+
		"{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")

	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "tiny.gguf")
	if err := os.WriteFile(path, g.bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	tmpl, err := os.ReadFile(filepath.Join("realup", "Modelfile.tmpl"))
	if err != nil {
		t.Fatal(err)
	}
	mf := strings.NewReplacer("@GGUF@", path, "@NUM_CTX@", strconv.Itoa(m.ctx), "@NUM_PREDICT@", strconv.Itoa(m.numPredict),
		"@REPEAT_PENALTY@", strconv.FormatFloat(m.repeatPenalty, 'f', -1, 64), "@NUM_THREAD@", strconv.Itoa(m.threads)).Replace(string(tmpl))
	mfPath := filepath.Join(dir, "Modelfile")
	if err := os.WriteFile(mfPath, []byte(mf), 0o644); err != nil {
		t.Fatal(err)
	}
	return mfPath
}

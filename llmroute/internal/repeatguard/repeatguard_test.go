package repeatguard

import (
	"math/rand/v2"
	"strings"
	"testing"
	"unicode/utf8"
)

// periodicSuffix reports whether the last l runes of rs repeat with period p.
func periodicSuffix(rs []rune, l, p int) bool {
	if l > len(rs) {
		return false
	}
	for i := len(rs) - l + p; i < len(rs); i++ {
		if rs[i] != rs[i-p] {
			return false
		}
	}
	return true
}

// reference is the brute-force verdict on rs: confirmed when the text ends
// with a periodic stretch of period p <= maxPeriod covering max(3p,
// minSpan) runes; holding (when not confirmed) when one covers max(2p,
// HoldFrom).
func reference(rs []rune, minSpan, maxPeriod int) (confirmed, holding bool) {
	for p := 1; p <= maxPeriod; p++ {
		if periodicSuffix(rs, max(3*p, minSpan), p) {
			return true, false
		}
	}
	for p := 1; p <= maxPeriod; p++ {
		if periodicSuffix(rs, max(2*p, HoldFrom), p) {
			return false, true
		}
	}
	return false, false
}

// check feeds text in the given pieces and compares the detector with the
// reference after every rune the reference can see: the first
// confirmation must come at the same rune, and before it the holding
// verdict after each piece must agree.
func check(t *testing.T, text string, cuts []int, minSpan, maxPeriod int) {
	t.Helper()
	d := New(minSpan, maxPeriod)
	b := []byte(text)
	// The reference's first confirmation, rune by rune.
	all := []rune(text)
	first := -1
	for n := 1; n <= len(all); n++ {
		if c, _ := reference(all[:n], minSpan, maxPeriod); c {
			first = n
			break
		}
	}
	prev := 0
	for _, end := range append(cuts, len(b)) {
		if end < prev || end > len(b) {
			continue
		}
		piece := b[prev:end]
		cut := d.np > 0 // the piece starts by completing a cut rune
		took := d.Write(piece)
		if d.Confirmed() {
			if first < 0 {
				t.Fatalf("false positive after %d runes: period %d span %d in %q", d.Runes(), d.period, d.span, text)
			}
			if int(d.Runes()) != first {
				t.Fatalf("confirmed at rune %d, the reference at %d (%q)", d.Runes(), first, text)
			}
			// The bytes taken end at the confirming rune (not counted
			// when it was a cut rune completed by this piece).
			if got := utf8.RuneCount(b[:prev+took]); !cut && got != first {
				t.Fatalf("Write took %d bytes (%d runes), the run was confirmed at rune %d", took, got, first)
			}
			p, span := d.Run()
			if !periodicSuffix(all[:first], span, p) || span < max(3*p, minSpan) {
				t.Fatalf("Run() = %d, %d: not a run at rune %d", p, span, first)
			}
			return
		}
		if took != len(piece) {
			t.Fatalf("Write took %d of %d bytes without a confirmation", took, len(piece))
		}
		seen := []rune(string(b[:end]))
		if int(d.Runes()) < len(seen) {
			seen = seen[:d.Runes()] // a rune cut by the piece's end
		}
		if int(d.Runes()) != len(seen) {
			t.Fatalf("read %d runes, the text has %d", d.Runes(), len(seen))
		}
		if _, h := reference(seen, minSpan, maxPeriod); h != d.Holding() {
			t.Fatalf("after %d runes holding = %v, the reference says %v (%q)", len(seen), d.Holding(), h, string(seen))
		}
		prev = end
	}
	if first >= 0 && first <= int(d.Runes()) {
		t.Fatalf("missed the run the reference confirms at rune %d (%q)", first, text)
	}
}

func everyN(b string, n int) []int {
	var cuts []int
	for i := n; i < len(b); i += n {
		cuts = append(cuts, i)
	}
	return cuts
}

func TestDetectorLoops(t *testing.T) {
	sentence := "The answer is in the config file, look there. "
	cases := []struct {
		name string
		text string
		want bool
	}{
		{"sentence", "Sure. " + strings.Repeat(sentence, 40), true},
		{"bang", "Wow" + strings.Repeat("!", 1000), true},
		{"cjk", "答案是" + strings.Repeat("我不知道。", 200), true},
		{"emoji", "ok " + strings.Repeat("🙂🎉", 300), true},
		{"ha ha ha", "He said ha ha ha and left.", false},
		{"table", strings.Repeat("| a | b |\n|---|---|\n| 1 | 2 |\n| 3 | 4 |\n", 1), false},
		{"list", "- item one\n- item two\n- item three\n- item four\n- item five\n", false},
		{"braces", "func f() {\n\tif x {\n\t\tif y {\n\t\t\tz()\n\t\t}\n\t}\n}\n", false},
		{"rule under span", strings.Repeat("-", 100), false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			for _, n := range []int{1, 3, 8, 1 << 20} {
				check(t, tc.text, everyN(tc.text, n), 400, 200)
			}
			d := New(400, 200)
			d.WriteString(tc.text)
			if d.Confirmed() != tc.want {
				t.Fatalf("confirmed = %v, want %v", d.Confirmed(), tc.want)
			}
		})
	}
}

func TestDetectorUnitAndSpan(t *testing.T) {
	d := New(400, 200)
	d.WriteString("Intro text. " + strings.Repeat("我不知道。", 200))
	if !d.Confirmed() {
		t.Fatal("the CJK loop was not found")
	}
	p, span := d.Run()
	if p != 5 || span != 400 {
		t.Fatalf("period %d span %d, want 5 and 400", p, span)
	}
	if u := string(d.Unit(nil, 80)); u != "我不知道。" {
		t.Fatalf("unit %q", u)
	}
	if u := string(d.Unit(nil, 2)); u != "我不" {
		t.Fatalf("unit cut at 2 runes: %q", u)
	}
	d.Reset()
	if d.Confirmed() || d.Runes() != 0 {
		t.Fatal("Reset kept state")
	}
}

func TestDetectorInvalidUTF8(t *testing.T) {
	// Bad bytes and runes cut between pieces, including an invalid
	// continuation after a cut lead byte.
	text := "a\xf0\x9fb" + strings.Repeat("\xe4\xb8", 3) + "🙂" + strings.Repeat("x\xff", 300)
	for n := 1; n < 6; n++ {
		check(t, text, everyN(text, n), 64, 16)
	}
}

// randomText builds text from a small alphabet of runes of every width,
// with loops spliced in, so that near-misses and real runs are both common.
func randomText(rng *rand.Rand, n int) string {
	alpha := []string{"a", "b", " ", "é", "我", "🙂", "\xff"}
	var sb strings.Builder
	for sb.Len() < n {
		if rng.IntN(8) == 0 {
			unit := ""
			for k := rng.IntN(12) + 1; k > 0; k-- {
				unit += alpha[rng.IntN(len(alpha))]
			}
			sb.WriteString(strings.Repeat(unit, rng.IntN(20)+1))
			continue
		}
		sb.WriteString(alpha[rng.IntN(len(alpha))])
	}
	return sb.String()
}

func TestDetectorRandom(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for i := 0; i < 400; i++ {
		text := randomText(rng, 300)
		var cuts []int
		for c := 0; c < len(text); c += rng.IntN(9) + 1 {
			cuts = append(cuts, c)
		}
		check(t, text, cuts, 16+rng.IntN(40), 1+rng.IntN(20))
	}
}

func FuzzDetector(f *testing.F) {
	f.Add("abcabcabcabcabcabcabcabc", uint8(3), uint8(16), uint8(4))
	f.Add(strings.Repeat("我不知道。", 20), uint8(2), uint8(20), uint8(8))
	f.Add("ha ha ha ha ha ha ha ha", uint8(1), uint8(16), uint8(3))
	f.Fuzz(func(t *testing.T, text string, step, span, period uint8) {
		if len(text) > 2000 {
			return
		}
		minSpan := MinSpan + int(span)%64
		maxPeriod := 1 + int(period)%70
		check(t, text, everyN(text, int(step)%16+1), minSpan, maxPeriod)
	})
}

func TestDetectorNoAllocs(t *testing.T) {
	text := []byte(prose(20000))
	d := New(400, 200)
	allocs := testing.AllocsPerRun(10, func() {
		d.Reset()
		for i := 0; i < len(text); i += 32 {
			d.Write(text[i:min(i+32, len(text))])
		}
	})
	if allocs != 0 {
		t.Fatalf("%v allocations per answer", allocs)
	}
	if d.Confirmed() {
		t.Fatal("a false positive on prose")
	}
}

// prose is n runes of varied text with no loop: words drawn at random.
func prose(n int) string {
	words := strings.Fields(`the a proxy routes each request to an upstream model and when one fails it
		tries the next the answer streams back to the client as server sent events with deltas of text
		we measure latency tokens and cost per request so that operators see where time goes 我们 测试 中文
		и немного кириллицы too 🙂 and code like func main() { fmt.Println(x) } | a | b |`)
	rng := rand.New(rand.NewPCG(7, 7))
	var sb strings.Builder
	for runes := 0; runes < n; runes++ {
		w := words[rng.IntN(len(words))]
		runes += utf8.RuneCountInString(w)
		sb.WriteString(w)
		if rng.IntN(12) == 0 {
			sb.WriteString(".\n")
		} else {
			sb.WriteByte(' ')
		}
	}
	return string([]rune(sb.String())[:n])
}

// BenchmarkDetector: a 20K-rune answer in 8-rune deltas; reported per rune,
// in wall time and in CPU time (the process's, which on a busy machine is
// the figure that says what the detector costs).
func BenchmarkDetector(b *testing.B) {
	text := prose(20000)
	rs := []rune(text)
	var deltas [][]byte
	for i := 0; i < len(rs); i += 8 {
		deltas = append(deltas, []byte(string(rs[i:min(i+8, len(rs))])))
	}
	d := New(400, 200)
	b.ReportAllocs()
	cpu0 := cpuTime()
	for b.Loop() {
		d.Reset()
		for _, delta := range deltas {
			d.Write(delta)
		}
	}
	cpu := cpuTime() - cpu0
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/float64(len(rs)), "ns/rune")
	b.ReportMetric(float64(cpu.Nanoseconds())/float64(b.N)/float64(len(rs)), "cpu-ns/rune")
}

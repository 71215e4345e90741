// Package repeatguard finds an answer that is stuck in a loop: text that
// ends with at least three back-to-back copies of one unit of 1 to
// maxPeriod runes, covering at least minSpan runes.
//
// The Detector reads the text incrementally, in pieces of any size cut
// anywhere (a rune may straddle two pieces), allocates nothing after New,
// and costs a bounded amount of work per rune:
//
//   - Every rune falls into one of 128 classes. For each class a bitset over
//     a ring of the last W positions says where the class occurred, so
//     "which periods p in 1..maxPeriod have class(r[i-p]) == class(r[i])"
//     is a window of that bitset (a few word operations).
//   - Seven more levels AND that mask with the previous rune's, giving the
//     periods whose class matched for the last 8 runes in a row. In ordinary
//     text this set is almost always empty.
//   - Only the periods in that set are followed rune by rune, with an exact
//     comparison of the runes themselves, which gives their exact match run.
//
// The text ends with a periodic stretch of period p and length run+p, where
// run is the number of trailing positions i with r[i] == r[i-p]. The
// thresholds below never need a run under 8 (New enforces it), so following
// only those periods is exact.
package repeatguard

import (
	"math/bits"
	"unicode/utf8"
	"unsafe"
)

const (
	// classBits: runes fall into 1<<classBits classes.
	classBits = 7
	// track is the class-match streak after which a period is followed
	// exactly; thresholds never need a shorter run.
	track = 8
	// HoldFrom is the shortest periodic stretch that is evidence (held
	// back): "ha ha ha" and a short rule of dashes pass at once.
	HoldFrom = 16
	// MinSpan is the smallest span New accepts: every threshold then needs
	// a run of at least track.
	MinSpan = 16
	// MaxPeriod is the largest period New accepts.
	MaxPeriod = 256
	// nw: words of a period mask (bit p-1 is period p).
	nw = MaxPeriod / 64
	// w is the ring's size in runes (a power of two above MaxPeriod), wpc
	// the words of a class's bitset over it. Constants: the compiler then
	// drops the bounds checks of the per-rune path.
	w    = 2 * MaxPeriod
	wpc  = w / 64
	mask = w - 1
	// none fills the ring: no rune decodes to it.
	none = -1
)

// Detector follows one text (the content of an answer, or its reasoning).
type Detector struct {
	minSpan, maxPeriod int

	ring [w]rune                     // the last w runes, r[i] at ring[i&mask]
	occ  [1 << classBits][wpc]uint64 // per class: the ring positions (reversed) holding it
	last pmask                       // periods whose class matched, for the last 8 runes
	// Streaks by doubling: m1 the previous rune's matches, a2 the last
	// four 2-rune streaks, a4 the last eight 4-rune streaks (rings).
	m1  pmask
	a2  [4]pmask
	a4  [8]pmask
	run [MaxPeriod + 1]int32 // exact match run of each followed period
	lim pmask                // the periods 1..maxPeriod

	n int64 // runes read

	partial [utf8.UTFMax]byte // the start of a rune cut by the end of a piece
	np      int

	holding   bool
	confirmed bool
	period    int   // the period found (holding or confirmed)
	span      int   // the periodic stretch's length in runes at that point
	at        int64 // runes read when it was found
}

// New returns a detector for runs of at least minSpan runes with units of up
// to maxPeriod runes. Callers validate: minSpan >= MinSpan, 1 <= maxPeriod <=
// MaxPeriod.
func New(minSpan, maxPeriod int) *Detector {
	minSpan = max(minSpan, MinSpan)
	maxPeriod = min(max(maxPeriod, 1), MaxPeriod)
	d := &Detector{minSpan: minSpan, maxPeriod: maxPeriod}
	for p := 1; p <= maxPeriod; p++ {
		d.lim[(p-1)>>6] |= 1 << ((p - 1) & 63)
	}
	d.Reset()
	return d
}

// Reset forgets the text read so far.
func (d *Detector) Reset() {
	if d.n == 0 && d.np == 0 && d.ring[0] == none {
		return // nothing read since the last reset: nothing to clear
	}
	for i := range d.ring {
		d.ring[i] = none
	}
	d.occ = [1 << classBits][wpc]uint64{}
	d.last, d.m1, d.a2, d.a4 = pmask{}, pmask{}, [4]pmask{}, [8]pmask{}
	d.n, d.np = 0, 0
	d.holding, d.confirmed = false, false
	d.period, d.span, d.at = 0, 0, 0
}

// Holding reports that the text read so far ends inside a growing run that
// is evidence: a periodic stretch of at least two copies and at least
// HoldFrom runes, not yet confirmed.
func (d *Detector) Holding() bool { return d.holding }

// Confirmed reports that a run was found; the detector then reads nothing
// more until Reset.
func (d *Detector) Confirmed() bool { return d.confirmed }

// Run is the run found or held: its period (the unit's length in runes) and
// its span in runes, ending at the last rune read (at confirmation, the
// rune that confirmed it).
func (d *Detector) Run() (period, span int) { return d.period, d.span }

// Config is the detector's span and period, as New took them.
func (d *Detector) Config() (minSpan, maxPeriod int) { return d.minSpan, d.maxPeriod }

// Runes is how many runes were read.
func (d *Detector) Runes() int64 { return d.n }

// Unit appends the run's unit as it starts the run (its first copy), at
// most limit runes of it.
func (d *Detector) Unit(dst []byte, limit int) []byte {
	if d.period == 0 {
		return dst
	}
	last := d.at - 1 // the rune that ended the run
	start := d.at - int64(d.span)
	per := int64(d.period)
	for k := int64(0); k < int64(min(d.period, limit)); k++ {
		// The stretch is periodic: rune start+k equals the one at the same
		// phase in the last copy, which the ring still holds.
		j := last - (last-(start+k))%per
		dst = utf8.AppendRune(dst, d.ring[int(j)&mask])
	}
	return dst
}

// Write reads the next piece of text and returns how many bytes of it were
// taken: all of them, unless a run was confirmed inside the piece, then up to
// and including the rune that confirmed it. Invalid UTF-8 counts as one
// U+FFFD per bad byte.
func (d *Detector) Write(p []byte) int {
	if d.confirmed {
		return 0
	}
	i := 0
	for d.np > 0 {
		// The rune the last piece cut, completed from p. An invalid
		// sequence gives U+FFFD for its first byte; the bytes after it are
		// read again.
		if !utf8.FullRune(d.partial[:d.np]) {
			if i == len(p) {
				return i
			}
			d.partial[d.np] = p[i]
			d.np++
			i++
			continue
		}
		r, size := utf8.DecodeRune(d.partial[:d.np])
		d.np = copy(d.partial[:], d.partial[size:d.np])
		if d.add(r) {
			return max(0, i-d.np)
		}
	}
	for i < len(p) {
		c := p[i]
		if c < utf8.RuneSelf {
			i++
			if d.add(rune(c)) {
				return i
			}
			continue
		}
		if !utf8.FullRune(p[i:]) {
			d.np = copy(d.partial[:], p[i:])
			return len(p)
		}
		r, size := utf8.DecodeRune(p[i:])
		i += size
		if d.add(r) {
			return i
		}
	}
	return len(p)
}

// WriteString is Write for a string.
func (d *Detector) WriteString(s string) int {
	// The conversion does not escape: no allocation.
	return d.Write(unsafeBytes(s))
}

func class(r rune) int {
	return int(uint32(r)*0x9E3779B1) >> (32 - classBits)
}

// add reads one rune; it reports a confirmation.
func (d *Detector) add(r rune) bool {
	i := d.n
	slot := int(i) & mask
	pos := d.rev(i)
	// The ring slot's old rune leaves the window.
	if old := d.ring[slot]; old != none {
		d.occ[class(old)][pos>>6] &^= 1 << (pos & 63)
	}
	d.ring[slot] = r
	b := &d.occ[class(r)]

	// m: period p (bit p-1) where class(r[i-p]) == class(r). In the reversed
	// ring, r[i-p] sits at rev(i)+p.
	base := d.rev(i) + 1
	var m pmask
	for k := range m {
		m[k] = window(b, base+64*k) & d.lim[k]
	}
	// Streaks of 2, 4 and 8 runes: each ANDs two of the half length.
	a2 := m.and(&d.m1)
	a4 := a2.and(&d.a2[(i-2)&3])
	top := a4.and(&d.a4[(i-4)&7])
	d.m1, d.a2[i&3], d.a4[i&7] = m, a2, a4
	// r takes its place in its class only now: it is not its own match.
	b[pos>>6] |= 1 << (pos & 63)
	d.n++

	d.holding = false
	found := false
	was := d.last
	d.last = top
	if top == (pmask{}) {
		return false // the common case: nothing matched 8 runes in a row
	}
	for k := range top {
		cur, was := top[k], was[k]
		for cur != 0 {
			t := bits.TrailingZeros64(cur)
			cur &= cur - 1
			p := 64*k + t + 1
			var run int32
			if was&(1<<t) == 0 {
				run = d.countBack(p) // just followed: at most track
			} else if d.ring[(int(i)-p)&mask] == r {
				run = d.run[p] + 1
			}
			d.run[p] = run
			if found {
				continue
			}
			span := int(run) + p
			if span >= max(3*p, d.minSpan) {
				d.confirmed, d.holding = true, false
				d.period, d.span, d.at = p, span, d.n
				found = true
				continue
			}
			if !d.holding && span >= max(2*p, HoldFrom) {
				d.holding = true
				d.period, d.span, d.at = p, span, d.n
			}
		}
	}
	return found
}

// pmask is a set of periods: bit p-1 is period p.
type pmask [nw]uint64

func (a *pmask) and(b *pmask) pmask {
	return pmask{a[0] & b[0], a[1] & b[1], a[2] & b[2], a[3] & b[3]}
}

// rev is the reversed ring position of rune i: r[i-p] is at rev(i)+p.
func (d *Detector) rev(i int64) int { return int(-i) & mask }

// window returns 64 bits of the ring bitset b starting at bit off (taken
// modulo w).
func window(b *[wpc]uint64, off int) uint64 {
	off &= mask
	word, sh := off>>6, uint(off&63)
	return b[word]>>sh | b[(word+1)%wpc]<<(63-sh)<<1
}

// countBack is the exact match run of period p ending at the rune just
// read, counting at most track positions, none before the text's start.
func (d *Detector) countBack(p int) int32 {
	last := d.n - 1
	var run int32
	for j := last; j >= int64(p) && run < track; j-- {
		if d.ring[int(j)&mask] != d.ring[int(j-int64(p))&mask] {
			break
		}
		run++
	}
	return run
}

func unsafeBytes(s string) []byte { return unsafe.Slice(unsafe.StringData(s), len(s)) }

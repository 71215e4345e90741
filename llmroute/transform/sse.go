package transform

import "bytes"

// SSE framing (https://html.spec.whatwg.org/multipage/server-sent-events.html).
// Lines end in LF, CRLF or a lone CR; an event ends at a blank line. The
// scanner below is resumable across arbitrary chunk boundaries, including a
// CRLF split between two chunks, and never copies: it only reports where the
// current event ends.

// sseScanner tracks where the bytes seen so far stand in the framing.
type sseScanner struct {
	lineStart  bool // at the start of a line
	afterCR    bool // the previous byte was a CR: a LF now completes CRLF
	hasContent bool // the current event has a non-blank line
}

func (sc *sseScanner) reset() { *sc = sseScanner{lineStart: true} }

// scan consumes p until the current event ends. It returns the index just past
// the event's final line terminator and done=true, or len(p) and done=false
// when p ends inside the event. Blank lines before an event's first line (and
// the LF half of a CRLF whose CR ended the previous event) belong to the next
// event: an event that is nothing but line ends is not an event.
//
// When the blank line's terminator is a CR, the event is reported complete at
// once; a LF that follows it immediately in p is included, and a LF at the
// start of the next chunk is absorbed as the CRLF's second half.
func (sc *sseScanner) scan(p []byte) (end int, done bool) {
	i := 0
	for i < len(p) {
		c := p[i]
		if sc.afterCR {
			sc.afterCR = false
			if c == '\n' {
				i++
				continue
			}
		}
		if c != '\n' && c != '\r' {
			sc.lineStart, sc.hasContent = false, true
			j := indexEOL(p[i:])
			if j < 0 {
				return len(p), false
			}
			i += j
			continue
		}
		i++
		if c == '\r' {
			sc.afterCR = true
		}
		if !sc.lineStart {
			sc.lineStart = true
			continue
		}
		if !sc.hasContent {
			continue // leading blank line
		}
		sc.hasContent = false
		if c == '\r' && i < len(p) && p[i] == '\n' {
			i++
			sc.afterCR = false
		}
		return i, true
	}
	return len(p), false
}

// indexEOL returns the index of the first CR or LF in b, or -1.
func indexEOL(b []byte) int {
	j := bytes.IndexByte(b, '\n')
	lim := b
	if j >= 0 {
		lim = b[:j]
	}
	if k := bytes.IndexByte(lim, '\r'); k >= 0 {
		return k
	}
	return j
}

// nextLine returns the line starting at b[i] as [i, le) and the index after its
// terminator (le when the line is unterminated).
func nextLine(b []byte, i int) (le, next int) {
	j := indexEOL(b[i:])
	if j < 0 {
		return len(b), len(b)
	}
	le = i + j
	if b[le] == '\r' && le+1 < len(b) && b[le+1] == '\n' {
		return le, le + 2
	}
	return le, le + 1
}

// dataValue reports whether line is a "data" field line and returns the
// offset of its value within line (after "data:" and one optional space).
func dataValue(line []byte) (off int, ok bool) {
	if len(line) < 4 || string(line[:4]) != "data" {
		return 0, false
	}
	if len(line) == 4 {
		return 4, true
	}
	if line[4] != ':' {
		return 0, false
	}
	if len(line) > 5 && line[5] == ' ' {
		return 6, true
	}
	return 5, true
}

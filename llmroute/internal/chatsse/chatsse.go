// Package chatsse reads upstream chat completions for the wire translators
// (Messages, Gemini): it splits a stream written to it, in pieces of any
// size, into its events' data, and reads the members of each chunk (or of
// a whole non-stream answer) a translator needs. It allocates nothing once its buffers have grown.
package chatsse

import (
	"bytes"
	"errors"

	"github.com/llm-route/caddy-llm-route/llmroute/internal/jsonscan"
)

// MaxLine bounds the bytes buffered for one upstream line and for one
// event's data: a longer line or event is skipped to its end, not held.
const MaxLine = 4 << 20

// Handler takes the events' data.
type Handler interface {
	// Event is one event's data, its `data:` lines joined by "\n", trimmed
	// of JSON white space in front and spaces and tabs behind (a payload
	// that is not valid JSON as it stands is not a chunk). It is only
	// valid during the call and may be empty.
	Event(data []byte)
	// Stopped reports that the handler takes nothing more (it failed):
	// Write returns at once.
	Stopped() bool
}

// Reader is the state of the line reading. The zero value is ready.
type Reader struct {
	line  []byte // partial upstream line
	data  []byte // data of the current upstream event
	drop  bool   // the current line is too long: skip to its end
	skip  bool   // the current event is too long: skip to its end
	gotCR bool   // the previous byte was a CR
}

// Reset readies r for a new stream, keeping its buffers.
func (r *Reader) Reset() { *r = Reader{line: r.line[:0], data: r.data[:0]} }

// Write reads p, handing each complete event to h.
func (r *Reader) Write(p []byte, h Handler) {
	for i := 0; i < len(p) && !h.Stopped(); {
		if r.gotCR {
			r.gotCR = false
			if p[i] == '\n' { // second half of a CRLF
				i++
				continue
			}
		}
		j := bytes.IndexAny(p[i:], "\r\n")
		if j < 0 {
			r.addLine(p[i:])
			break
		}
		r.addLine(p[i : i+j])
		if p[i+j] == '\r' {
			r.gotCR = true
		}
		i += j + 1
		r.endLine(h)
	}
}

// Close ends the stream: an unterminated last line and the event it
// belongs to are handed over as if the stream had ended with a blank line.
func (r *Reader) Close(h Handler) {
	if len(r.line) > 0 {
		r.endLine(h)
	}
	r.dispatch(h)
}

func (r *Reader) addLine(b []byte) {
	if r.drop {
		return
	}
	if len(r.line)+len(b) > MaxLine {
		r.drop, r.line = true, r.line[:0]
		return
	}
	r.line = append(r.line, b...)
}

// endLine handles one complete upstream line.
func (r *Reader) endLine(h Handler) {
	line := r.line
	r.line = r.line[:0]
	if r.drop {
		r.drop = false
		return
	}
	if len(line) == 0 { // blank line: the event is complete
		r.dispatch(h)
		r.skip = false
		return
	}
	if v, ok := bytes.CutPrefix(line, []byte("data:")); ok {
		if len(v) > 0 && v[0] == ' ' {
			v = v[1:]
		}
		if r.skip || len(r.data)+len(v) >= MaxLine {
			r.skip, r.data = true, r.data[:0] // too big to be a usable chunk
			return
		}
		if len(r.data) > 0 {
			r.data = append(r.data, '\n')
		}
		r.data = append(r.data, v...)
	}
	// event:, id:, retry: and comments carry nothing for the translation.
}

// dispatch hands the current event's data to h.
func (r *Reader) dispatch(h Handler) {
	data := r.data[jsonscan.SkipWS(r.data, 0):]
	for len(data) > 0 && (data[len(data)-1] == ' ' || data[len(data)-1] == '\t') {
		data = data[:len(data)-1]
	}
	r.data = r.data[:0]
	h.Event(data)
}

// Chunk is what a translator reads of one chat.completion.chunk (or an
// error payload): its top-level members as raw JSON values, nil when
// absent.
type Chunk struct {
	ID, Model, Choices, Usage, Error []byte
}

// ReadChunk sorts an event's data: done for "[DONE]", ok with the chunk's
// members for a valid JSON object, neither for anything else (empty, not
// an object, or not valid JSON as it stands: nothing a client could use).
func ReadChunk(data []byte) (c Chunk, ok, done bool) {
	if len(data) == 0 {
		return c, false, false
	}
	if string(data) == "[DONE]" {
		return c, false, true
	}
	if data[0] != '{' || !jsonscan.Valid(data) {
		return c, false, false
	}
	return members(data), true, false
}

// ReadCompletion reads the same members of a whole (non-stream)
// chat.completion body, JSON white space around it allowed. A body that is
// not one (invalid JSON, not an object, an "error" member, no choices) is
// an error, which the caller prefixes with its package's name.
func ReadCompletion(body []byte) (Chunk, error) {
	if !jsonscan.Valid(body) {
		return Chunk{}, errors.New("upstream body is not valid JSON")
	}
	i := jsonscan.SkipWS(body, 0)
	if body[i] != '{' {
		return Chunk{}, errors.New("upstream body is not an object")
	}
	c := members(body[i:])
	if c.Error != nil {
		return c, errors.New("upstream answered an error object")
	}
	if c.Choices == nil || c.Choices[0] != '[' {
		return c, errors.New("upstream body has no choices")
	}
	return c, nil
}

// members reads the top-level members of a valid JSON object.
func members(obj []byte) (c Chunk) {
	it := jsonscan.IterObject(obj, 0, false)
	var m jsonscan.Member
	var tmp [16]byte
	for it.Next(&m) {
		v := obj[m.Vs:m.Ve]
		switch string(jsonscan.KeyOf(obj, &m, tmp[:])) {
		case "id":
			c.ID = v
		case "model":
			c.Model = v
		case "choices":
			c.Choices = v
		case "usage":
			c.Usage = v
		case "error":
			c.Error = v
		}
	}
	return c
}

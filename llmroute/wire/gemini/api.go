package gemini

import "errors"

// Options carries what a Gemini request does not hold in its body.
type Options struct {
	// ReasoningField is the chat message member that carries the
	// assistant's reasoning for this upstream ("" = none).
	ReasoningField string
	// Model is the model named in the URL path.
	Model string
	// Stream is true for streamGenerateContent.
	Stream bool
}

// Info is what the answer translation needs to know about the request.
type Info struct {
	Model           string
	Stream          bool
	IncludeThoughts bool
	DroppedTools    []string
	DroppedFields   []string
}

// Error is a request the translator refuses.
type Error struct {
	Status        int
	Code, Message string
}

func (e *Error) Error() string { return e.Message }

var errTODO = errors.New("gemini: not implemented yet")

// ErrUnfinished is returned by Close when the chat stream had neither a
// finish_reason nor [DONE].
var ErrUnfinished = errors.New("gemini: chat stream ended before it finished")

func ToChat(dst, body []byte, opt Options) ([]byte, *Info, error) { return dst, nil, errTODO }
func SessionBody(dst, body []byte) ([]byte, error)                { return dst, errTODO }
func FromChat(dst, chat []byte, info *Info) ([]byte, error)       { return dst, errTODO }

type Stream struct {
	info *Info
	emit func([]byte) error
	done bool
}

func NewStream(info *Info, emit func([]byte) error) *Stream {
	s := &Stream{}
	s.Reset(info, emit)
	return s
}
func (s *Stream) Reset(info *Info, emit func([]byte) error) { *s = Stream{info: info, emit: emit} }
func (s *Stream) Write(p []byte) (int, error)               { return len(p), nil }
func (s *Stream) Close() error                              { return ErrUnfinished }
func (s *Stream) Fail(code, message string) error           { return errTODO }
func (s *Stream) Finished() bool                            { return s.done }

func StatusName(status int) string                                         { return "INTERNAL" }
func ErrorBody(status int, code, message string, retryAfter int) []byte    { return nil }
func AppendErrorEvent(dst []byte, status int, code, message string) []byte { return dst }
func TranslateError(status int, chatBody []byte) []byte                    { return nil }
func CountTokensEstimate(body []byte) (int, error)                         { return 0, errTODO }
func CountTokensBody(n int) []byte                                         { return nil }
func ModelsBody(names []string) []byte                                     { return nil }
func ModelBody(name string) []byte                                         { return nil }

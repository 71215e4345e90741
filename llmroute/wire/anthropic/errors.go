package anthropic

import (
	"bytes"
	"strconv"

	"github.com/llm-route/caddy-llm-route/llmroute/internal/jsonscan"
)

// ErrorType is Anthropic's error.type for an HTTP status: 400
// invalid_request_error, 401 authentication_error, 402 billing_error, 403
// permission_error, 404 not_found_error, 413 request_too_large, 429
// rate_limit_error, 503 and 529 overloaded_error, 504 timeout_error, other
// 4xx invalid_request_error, other 5xx api_error.
func ErrorType(status int) string {
	switch status {
	case 401:
		return "authentication_error"
	case 402:
		return "billing_error"
	case 403:
		return "permission_error"
	case 404:
		return "not_found_error"
	case 413:
		return "request_too_large"
	case 429:
		return "rate_limit_error"
	case 503, 529:
		return "overloaded_error"
	case 504:
		return "timeout_error"
	}
	if status >= 400 && status < 500 {
		return "invalid_request_error"
	}
	return "api_error"
}

// ErrorBody is a proxy-made error in Anthropic's shape:
// {"type":"error","error":{"type":…,"message":…,"code":…}}, with the type for
// status and code (e.g. "unsupported_parameter") left out when empty.
func ErrorBody(status int, code, message string) []byte {
	return appendErrorJSON(nil, ErrorType(status), code, message)
}

// appendErrorJSON appends an Anthropic error object.
func appendErrorJSON(dst []byte, typ, code, message string) []byte {
	dst = append(dst, `{"type":"error","error":{"type":"`...)
	dst = append(dst, typ...)
	dst = append(dst, `","message":`...)
	dst = jsonscan.AppendQuoted(dst, message)
	if code != "" {
		dst = append(dst, `,"code":`...)
		dst = jsonscan.AppendQuoted(dst, code)
	}
	return append(dst, "}}"...)
}

// maxErrorText bounds the upstream text quoted in a translated error.
const maxErrorText = 1000

// TranslateError turns a chat upstream's 4xx/5xx body into Anthropic's
// shape. The message is the upstream's error.message (OpenAI shape), a
// top-level "message", a string "error", or else the start of the body as
// text; a string error.code is kept as code. The type follows status.
func TranslateError(status int, upstreamBody []byte) []byte {
	var msg, code []byte
	body := bytes.TrimSpace(upstreamBody)
	isObj := len(body) > 0 && body[0] == '{' && jsonscan.Valid(body)
	if isObj {
		e := jsonscan.ObjGet(body, "error")
		switch {
		case e != nil && e[0] == '{':
			msg, code = jsonscan.ObjGet(e, "message"), jsonscan.ObjGet(e, "code")
		case e != nil && e[0] == '"':
			msg = e
		default:
			msg = jsonscan.ObjGet(body, "message")
		}
	}
	var text, c string
	switch {
	case msg != nil && msg[0] == '"':
		text = string(jsonscan.AppendUnescape(nil, msg[1:len(msg)-1]))
	case !isObj && len(body) > 0:
		text = string(body)
		if len(text) > maxErrorText {
			// Invalid UTF-8 from a cut rune becomes U+FFFD when quoted.
			text = text[:maxErrorText] + "…"
		}
	default:
		text = "upstream error (HTTP " + strconv.Itoa(status) + ")"
	}
	if code != nil && code[0] == '"' {
		c = string(jsonscan.AppendUnescape(nil, code[1:len(code)-1]))
	}
	return appendErrorJSON(nil, ErrorType(status), c, text)
}

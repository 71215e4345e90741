package gemini

import (
	"bytes"
	"strconv"

	"github.com/llm-route/caddy-llm-route/llmroute/internal/jsonscan"
)

// StatusName is Google's error.status for an HTTP status: 400, 413 and 422
// INVALID_ARGUMENT, 401 UNAUTHENTICATED, 403 PERMISSION_DENIED, 404
// NOT_FOUND, 405 and 501 UNIMPLEMENTED, 409 ABORTED, 429
// RESOURCE_EXHAUSTED, 499 CANCELLED, 500 INTERNAL, 502 and 503 UNAVAILABLE,
// 504 DEADLINE_EXCEEDED, other 4xx FAILED_PRECONDITION, anything else
// INTERNAL.
func StatusName(status int) string {
	switch status {
	case 400, 413, 422:
		return "INVALID_ARGUMENT"
	case 401:
		return "UNAUTHENTICATED"
	case 403:
		return "PERMISSION_DENIED"
	case 404:
		return "NOT_FOUND"
	case 405, 501:
		return "UNIMPLEMENTED"
	case 409:
		return "ABORTED"
	case 429:
		return "RESOURCE_EXHAUSTED"
	case 499:
		return "CANCELLED"
	case 502, 503:
		return "UNAVAILABLE"
	case 504:
		return "DEADLINE_EXCEEDED"
	}
	if status >= 400 && status < 500 {
		return "FAILED_PRECONDITION"
	}
	return "INTERNAL"
}

// ErrorBody is a proxy-made error in Google's shape:
//
//	{"error":{"code":503,"message":…,"status":"UNAVAILABLE","details":[
//	  {"@type":"type.googleapis.com/google.rpc.ErrorInfo","reason":<code>,"domain":"llm_route"},
//	  {"@type":"type.googleapis.com/google.rpc.RetryInfo","retryDelay":"<retryAfter>s"}]}}
//
// ErrorInfo is left out when code is "", RetryInfo when retryAfter is not
// positive (Gemini CLI times its retry of a 429 by retryDelay), details when
// both are.
func ErrorBody(status int, code, message string, retryAfter int) []byte {
	return appendErrorJSON(nil, status, code, message, retryAfter)
}

// appendErrorJSON appends a Google error object.
func appendErrorJSON(dst []byte, status int, code, message string, retryAfter int) []byte {
	dst = append(dst, `{"error":{"code":`...)
	dst = strconv.AppendInt(dst, int64(status), 10)
	dst = append(dst, `,"message":`...)
	dst = appendQuotedText(dst, message)
	dst = append(dst, `,"status":"`...)
	dst = append(dst, StatusName(status)...)
	dst = append(dst, '"')
	if code != "" || retryAfter > 0 {
		dst = append(dst, `,"details":[`...)
		if code != "" {
			dst = append(dst, `{"@type":"type.googleapis.com/google.rpc.ErrorInfo","reason":`...)
			dst = appendQuotedText(dst, code)
			dst = append(dst, `,"domain":"llm_route"}`...)
		}
		if retryAfter > 0 {
			if code != "" {
				dst = append(dst, ',')
			}
			dst = append(dst, `{"@type":"type.googleapis.com/google.rpc.RetryInfo","retryDelay":"`...)
			dst = strconv.AppendInt(dst, int64(retryAfter), 10)
			dst = append(dst, `s"}`...)
		}
		dst = append(dst, ']')
	}
	return append(dst, "}}"...)
}

// AppendErrorEvent appends the error as one stream event,
// "data: {"error":…}\r\n\r\n", framed like Google's own events so it never
// runs into the one before it. Both genai SDKs surface it as an APIError.
func AppendErrorEvent(dst []byte, status int, code, message string) []byte {
	dst = append(dst, "data: "...)
	dst = appendErrorJSON(dst, status, code, message, 0)
	return append(dst, "\r\n\r\n"...)
}

// maxErrorText bounds the upstream text quoted in a translated error.
const maxErrorText = 1000

// TranslateError turns a chat upstream's 4xx/5xx body into Google's shape
// with the same HTTP status. The message is the upstream's error.message
// (OpenAI shape), a top-level "message", a string "error", or else the start
// of the body as text; a string error.code (else error.type) becomes the
// ErrorInfo reason.
func TranslateError(status int, chatBody []byte) []byte {
	msg, reason := errorText(status, chatBody)
	return appendErrorJSON(nil, status, reason, msg, 0)
}

// errorText reads the message and reason of a chat error body.
func errorText(status int, chatBody []byte) (text, reason string) {
	var msg, code, typ []byte
	body := bytes.TrimSpace(chatBody)
	isObj := len(body) > 0 && body[0] == '{' && jsonscan.Valid(body)
	if isObj {
		e := jsonscan.ObjGet(body, "error")
		switch {
		case e != nil && e[0] == '{':
			msg, code, typ = jsonscan.ObjGet(e, "message"), jsonscan.ObjGet(e, "code"), jsonscan.ObjGet(e, "type")
		case e != nil && e[0] == '"':
			msg = e
		default:
			msg = jsonscan.ObjGet(body, "message")
		}
	}
	switch {
	case msg != nil && msg[0] == '"':
		text = string(jsonscan.AppendUnescape(nil, msg[1:len(msg)-1]))
	case !isObj && len(body) > 0:
		text = string(body)
	default:
		text = "upstream error (HTTP " + strconv.Itoa(status) + ")"
	}
	if len(text) > maxErrorText {
		// Invalid UTF-8 from a cut rune becomes U+FFFD when quoted.
		text = text[:maxErrorText] + "…"
	}
	switch {
	case nonEmptyString(code):
		reason = string(jsonscan.AppendUnescape(nil, code[1:len(code)-1]))
	case nonEmptyString(typ):
		reason = string(jsonscan.AppendUnescape(nil, typ[1:len(typ)-1]))
	}
	return text, reason
}

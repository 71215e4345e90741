package responses

import (
	"encoding/json"
	"net/http"
	"strconv"

	"github.com/llm-route/caddy-llm-route/llmroute/internal/jsonscan"
)

// errorType is the OpenAI error type for an HTTP status.
func errorType(status int) string {
	switch {
	case status == http.StatusUnauthorized:
		return "authentication_error"
	case status == http.StatusForbidden:
		return "permission_error"
	case status == http.StatusNotFound:
		return "not_found_error"
	case status == http.StatusTooManyRequests:
		return "rate_limit_error"
	case status >= 500:
		return "server_error"
	}
	return "invalid_request_error"
}

// ErrorBody is a proxy-made error in OpenAI's shape, the one the chat front
// uses: {"error":{"message","type","param","code"}}.
func ErrorBody(status int, code, message string) []byte {
	return appendError(nil, errorType(status), code, "", message)
}

func appendError(dst []byte, typ, code, param, message string) []byte {
	dst = append(dst, `{"error":{"message":`...)
	dst = jsonscan.AppendQuoted(dst, message)
	dst = append(dst, `,"type":`...)
	dst = jsonscan.AppendQuoted(dst, typ)
	dst = append(dst, `,"param":`...)
	if param != "" {
		dst = jsonscan.AppendQuoted(dst, param)
	} else {
		dst = append(dst, `null`...)
	}
	dst = append(dst, `,"code":`...)
	if code != "" {
		dst = jsonscan.AppendQuoted(dst, code)
	} else {
		dst = append(dst, `null`...)
	}
	return append(dst, `}}`...)
}

// Body renders e in OpenAI's error shape, with its param.
func (e *Error) Body() []byte {
	return appendError(nil, errorType(e.Status), e.Code, e.Param, e.Message)
}

// TranslateError turns a chat upstream's 4xx/5xx body into the Responses
// error shape (which is OpenAI's error shape). The upstream's message, type,
// code and param are kept when the body is an OpenAI-style error (a numeric
// code, as llama.cpp sends, becomes its string); a body that is not one
// (HTML, plain text, another shape) becomes a generic message naming the
// status, so nothing unparsed reaches the client.
func TranslateError(status int, upstreamBody []byte) []byte {
	var e struct {
		Error json.RawMessage `json:"error"`
		// Some servers put the message at the top level.
		Message string `json:"message"`
		Detail  string `json:"detail"`
	}
	var inner struct {
		Message string          `json:"message"`
		Type    string          `json:"type"`
		Code    json.RawMessage `json:"code"`
		Param   string          `json:"param"`
	}
	msg, typ, code, param := "", "", "", ""
	if json.Unmarshal(upstreamBody, &e) == nil {
		switch {
		case len(e.Error) > 0 && e.Error[0] == '{' && json.Unmarshal(e.Error, &inner) == nil:
			msg, typ, param = inner.Message, inner.Type, inner.Param
			switch {
			case jsonscan.IsString(inner.Code):
				code = string(jsonscan.AppendStringValue(nil, inner.Code))
			case len(inner.Code) > 0 && inner.Code[0] >= '0' && inner.Code[0] <= '9':
				code = string(inner.Code)
			}
		case jsonscan.IsString(e.Error):
			msg = string(jsonscan.AppendStringValue(nil, e.Error))
		case e.Message != "":
			msg = e.Message
		case e.Detail != "":
			msg = e.Detail
		}
	}
	if msg == "" {
		msg = "upstream answered " + strconv.Itoa(status) + " " + http.StatusText(status)
	}
	if typ == "" {
		typ = errorType(status)
	}
	return appendError(nil, typ, code, param, msg)
}

// Package wire is the protocol layer of llm_route: one package per client
// wire API ("front") that the routing core can serve from an upstream that
// speaks only OpenAI chat completions ("back").
//
// Every translator is pure bytes → bytes, imports neither Caddy nor
// llmroute, and exposes the same roles (names may differ slightly):
//
//	ToChat(dst, body, opts) (chat, *Info, error)  front request → chat request
//	FromChat(dst, chat, info)                     chat.completion → front response
//	NewStream(info, emit) / Write / Close / Fail  chat SSE → front SSE
//	ErrorBody(status, code, msg), TranslateError  errors in the front's shape
//
// The core decides native vs translated per upstream (apis); a
// native attempt never touches these packages beyond front-specific body
// edits (anthropic.StripBillingBlock).
//
//	anthropic/   Anthropic Messages ⇄ chat
//	gemini/      Google Gemini API (generateContent) ⇄ chat
//	responses/   OpenAI Responses ⇄ chat
package wire

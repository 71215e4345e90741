// Package transform holds the byte-level transformations of llm_route: the
// request body rewrite (model swap, deep-merge patches, reasoning backfill),
// think-tag splitting of responses (whole and streamed), SSE framing, and the
// session-id registry. It imports nothing from Caddy or the rest of the module,
// so every piece can be unit-tested, benchmarked and fuzzed on its own.
//
// # Working on raw bytes
//
// Bodies are never unmarshalled and re-marshalled. A small scanner
// (llmroute/internal/jsonscan, shared with the wire translators) walks the
// bytes, records the spans that matter and copies everything else verbatim,
// so unrelated bytes, key order, white space, escapes and number
// formatting survive exactly. Results are appended to caller-provided dst
// slices, and the hot paths (stream chunks that need no change, request
// rewrites) do not allocate.
//
// Validation happens once, where input enters: ParseRequest is as strict as
// json.Valid (and faster); RewriteRequest and Patch.Apply then trust the
// structure. Stream chunks and completion bodies are validated strictly before
// they are rewritten, and anything that is not valid JSON of the expected shape
// passes through untouched.
//
// # Files
//
//	patch.go      Patch: compile, compose (Then), apply
//	request.go    ParseRequest, RequestEdit, RewriteRequest
//	reasoning.go  reasoning_field backfill
//	think.go      ThinkMode, the think-tag splitter, RewriteCompletion
//	sse.go        SSE framing
//	stream.go     StreamRewriter
//	session.go    Sessions
//
// # Decisions where the spec is silent
//
//   - Duplicate keys: the last occurrence is the one read and the one changed
//     (as encoding/json and most parsers do); earlier ones are copied as is.
//   - Keys are compared decoded ("mod\u0065l" is "model"); invalid UTF-8 in
//     keys is compared byte for byte.
//   - Patch keys the body lacks are appended after its last member, in patch
//     order; existing keys are changed in place.
//   - Think tags are exact and case-sensitive, do not nest, and a stray
//     "</think>" outside a block is content. A held tag prefix at the end of
//     the text ("<thi") was not a tag: it is content (or reasoning inside a
//     block). Text around tags is not trimmed. Think text is appended to an
//     existing reasoning_content string with no separator.
package transform

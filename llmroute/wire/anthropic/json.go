package anthropic

import "github.com/llm-route/caddy-llm-route/llmroute/internal/jsonscan"

// The JSON scanner itself lives in llmroute/internal/jsonscan, shared with
// llmroute/transform and wire/responses; this file keeps the one walk that
// only Messages bodies need.

// blockTypeText returns the raw "type" and "text" values of a content block
// (nil when absent); text is nil unless it is a string.
func blockTypeText(blk []byte) (typ, text []byte) {
	if len(blk) == 0 || blk[0] != '{' {
		return nil, nil
	}
	it := jsonscan.IterObject(blk, 0, false)
	var m jsonscan.Member
	for it.Next(&m) {
		switch {
		case jsonscan.KeyIs(blk, &m, "type"):
			typ = blk[m.Vs:m.Ve]
		case jsonscan.KeyIs(blk, &m, "text"):
			text = blk[m.Vs:m.Ve]
		}
	}
	if text != nil && text[0] != '"' {
		text = nil
	}
	return typ, text
}

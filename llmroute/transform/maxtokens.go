package transform

import (
	"strconv"

	"github.com/llm-route/caddy-llm-route/llmroute/internal/jsonscan"
)

// MaxTokens returns the request's output bound: the largest of its
// top-level max_tokens (chat, Messages, completions),
// max_completion_tokens (chat) and max_output_tokens (Responses) that is a
// positive integer, or 0 when it sets none. Budgets reserve by it,
// so a request naming several takes the largest.
func MaxTokens(body []byte) int64 {
	i := jsonscan.SkipWS(body, 0)
	if i >= len(body) || body[i] != '{' {
		return 0
	}
	it := jsonscan.IterObject(body, i, false)
	var m jsonscan.Member
	var best int64
	for it.Next(&m) {
		if !jsonscan.KeyIs(body, &m, "max_tokens") && !jsonscan.KeyIs(body, &m, "max_completion_tokens") && !jsonscan.KeyIs(body, &m, "max_output_tokens") {
			continue
		}
		n, err := strconv.ParseInt(string(body[m.Vs:m.Ve]), 10, 64)
		if err == nil && n > best {
			best = n
		}
	}
	return best
}

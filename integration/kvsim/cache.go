package kvsim

import "container/list"

// TokenBytes is the size of one simulated token: the prompt text is cut in
// 4-byte pieces (the last one may be shorter), about what real tokenizers
// give for English text and code.
const TokenBytes = 4

// vllmBlock is vLLM's default KV block size in tokens: its prefix cache
// reuses whole blocks only, so the cached count it reports is a multiple.
const vllmBlock = 16

// tokens is the number of simulated tokens of text.
func tokens(text string) int { return (len(text) + TokenBytes - 1) / TokenBytes }

// commonTokens is the number of leading tokens a and b share: whole
// 4-byte tokens of their common byte prefix, and the short last token too
// when the two texts are equal.
func commonTokens(a, b string) int {
	n := min(len(a), len(b))
	i := 0
	for i < n && a[i] == b[i] {
		i++
	}
	if i == len(a) && i == len(b) {
		return tokens(a)
	}
	return i / TokenBytes
}

// cache is the KV cache of one server: whole prompts, most recently used
// first, up to capacity tokens in all. Like llama.cpp's prompt cache it
// keeps each prompt whole, so two prompts that share a system prompt both
// count it (vLLM's block cache would store it once and hold more). A
// request reuses the longest common token prefix with any stored prompt.
type cache struct {
	capacity int // tokens; 0 = unlimited
	used     int
	lru      *list.List // of *entry, front = most recently used
	// evicted counts prompts and tokens pushed out by capacity (not
	// those a longer prompt of the same history replaced).
	evictedPrompts, evictedTokens int
}

type entry struct {
	text   string
	tokens int
}

func newCache(capacity int) *cache { return &cache{capacity: capacity, lru: list.New()} }

// lookup returns the tokens of text's longest common prefix with a stored
// prompt, and marks that prompt used.
func (c *cache) lookup(text string) int {
	best, bestN := (*list.Element)(nil), 0
	for e := c.lru.Front(); e != nil; e = e.Next() {
		if n := commonTokens(text, e.Value.(*entry).text); n > bestN {
			best, bestN = e, n
		}
	}
	if best != nil {
		c.lru.MoveToFront(best)
	}
	return bestN
}

// store keeps text as the most recently used prompt. Stored prompts that
// are a prefix of it are dropped (its KV holds them: the engine extended
// them in place), then the least recently used prompts go until it fits.
// A prompt larger than the whole capacity is not kept.
func (c *cache) store(text string) {
	for e := c.lru.Front(); e != nil; {
		next := e.Next()
		if en := e.Value.(*entry); len(en.text) <= len(text) && text[:len(en.text)] == en.text {
			c.lru.Remove(e)
			c.used -= en.tokens
		}
		e = next
	}
	n := tokens(text)
	if c.capacity > 0 && n > c.capacity {
		return
	}
	c.lru.PushFront(&entry{text: text, tokens: n})
	c.used += n
	for c.capacity > 0 && c.used > c.capacity {
		e := c.lru.Back()
		en := e.Value.(*entry)
		c.lru.Remove(e)
		c.used -= en.tokens
		c.evictedPrompts++
		c.evictedTokens += en.tokens
	}
}

// clear empties the cache (a restarted engine).
func (c *cache) clear() {
	c.lru.Init()
	c.used = 0
}

// reused is what an engine reports it took from its cache for a prompt of
// n tokens whose longest cached prefix is common tokens: every engine
// evaluates at least the prompt's last token (it needs its logits), and
// vLLM reuses whole blocks only.
func reused(engine Engine, common, n int) int {
	c := min(common, n-1)
	if engine == VLLM {
		c -= c % vllmBlock
	}
	return max(c, 0)
}

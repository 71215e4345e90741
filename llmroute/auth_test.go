package llmroute

import "testing"

func TestGlobMatch(t *testing.T) {
	for _, c := range []struct {
		pattern, name string
		want          bool
	}{
		{"gpt-4o", "gpt-4o", true},
		{"gpt-4o", "gpt-4o-mini", false}, // anchored
		{"gpt-*", "gpt-4o-mini", true},
		{"*", "anything/at/all", true},
		{"openai/*", "openai/gpt-4o", true},
		{"*/gpt-*", "openrouter/openai/gpt-4o", true}, // * spans /
		{"*-mini", "gpt-4o-mini", true},
		{"*-mini", "gpt-4o", false},
		{"a*b*c", "aXbYc", true},
		{"a*b*c", "aXbY", false},
		{"", "", true},
		{"", "x", false},
	} {
		if got := globMatch(c.pattern, c.name); got != c.want {
			t.Errorf("globMatch(%q, %q) = %v, want %v", c.pattern, c.name, got, c.want)
		}
	}
}

func TestPricesCost(t *testing.T) {
	p := compilePrices(Upstream{PriceInput: 2.5, PriceOutput: 10, PriceCachedInput: 1.25})
	// 1M input of which 400k cached, 100k output: 0.6·2.5 + 0.4·1.25 + 0.1·10 = $3.
	if got := p.cost(1_000_000, 400_000, 100_000); got != 3_000_000_000 {
		t.Fatalf("cost = %d nano-USD, want 3e9", got)
	}
	free := compilePrices(Upstream{})
	if free.cost(1000, 0, 1000) != 0 {
		t.Fatal("an upstream without prices costs something")
	}
	noCache := compilePrices(Upstream{PriceInput: 1})
	if got := noCache.cost(1_000_000, 1_000_000, 0); got != 1_000_000_000 {
		t.Fatalf("cached input without its own price = %d, want the input price", got)
	}
}

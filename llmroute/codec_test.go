package llmroute

import "testing"

// Every front has a codec (its refusals are written through it) and every
// api's codec speaks that api.
func TestCodecTables(t *testing.T) {
	for f := range numFronts {
		if frontCodecs[f] == nil {
			t.Errorf("front %d has no codec", f)
		}
	}
	for a, c := range codecs {
		if c == nil || c.api() != api(a) {
			t.Errorf("codecs[%s] is %T", api(a), c)
		}
	}
}

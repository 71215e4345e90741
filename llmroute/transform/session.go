package transform

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"sort"
	"sync"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/llm-route/caddy-llm-route/llmroute/internal/jsonscan"
)

// maxPrefixesPerSession caps the prefix hashes remembered per session (and
// recorded per request): the most recent 128 turns of a conversation. A new
// request matches when any of its last 128 prefixes is known, which covers a
// growing conversation (its previous request is a prefix) and an edited or
// regenerated turn anywhere in the last 128 messages. Memory is bounded by
// sessions × 128 map entries (about 6 MB at the production 1000 sessions).
const maxPrefixesPerSession = 128

// prefixKey is a truncated prefix hash; 128 bits is plenty for a registry of
// at most a few hundred thousand entries.
type prefixKey [16]byte

// Sessions derives stable session ids from chat histories.
//
// Each message, from the first "user" message on (earlier ones, typically a
// system prompt shared by every conversation of a client, are ignored), is
// reduced to a canonical form and chained: P0 = a fixed seed,
// Pk = SHA-256(Pk-1 ‖ canon(mk)). A request is in the same session as an
// earlier one when one of its prefix hashes was recorded for that session; the
// longest known prefix wins. Otherwise a new session starts, named by the hash
// of the whole history (32 hex digits). Every prefix of a request is recorded
// under its session, so a conversation keeps its id as it grows and when its
// last turn is regenerated or edited.
//
// The canonical form of a message keeps what identifies a turn and is stable
// when clients echo history back: role, content (a string, or the text parts
// of a content array concatenated, so "hi" and [{"type":"text","text":"hi"}]
// are equal; leading and trailing white space trimmed; null, "" and absent are
// equal; non-text parts by their canonical JSON without cache_control), name,
// tool_call_id, and tool_calls' id, function name and arguments. It ignores
// reasoning fields (reasoning, reasoning_content, reasoning_details: clients
// drop or add them, and the reasoning backfill adds one), every other field,
// JSON white space, key order and string escaping.
//
// Known limits: trimming or summarising the history breaks the prefix, so the
// conversation continues under a new id; conversations whose first user
// message (and what follows) are identical share one id. The registry lives
// in this process's memory: a restart gives active conversations new ids,
// and with several instances behind a load balancer each would name a
// conversation its own way. With the redis state the handler
// therefore keeps the registry in Redis too (History, Record: the same
// prefixes under the state prefix, the same TTL) and this one in step, so an
// id is the same whichever instance serves the next turn and outlives a
// restart while Redis keeps its data; while Redis is unreachable each
// instance answers from its own copy, and a conversation that began there
// meanwhile may get a second id. It holds at most maxSessions sessions
// (least recently used evicted first, with all their prefixes) for at most
// ttl since their last use; Redis keeps each prefix for ttl from its last
// use, give or take ttl/64 (a prefix is rewritten at most that often).
//
// A body without messages gets the hash of the body itself, unrecorded; one
// without a user message is chained from its first message. ID never returns
// "". Sessions is safe for concurrent use; hashing happens outside the lock.
type Sessions struct {
	max int
	ttl time.Duration
	now func() time.Time

	mu       sync.Mutex
	byPrefix map[prefixKey]*session
	head     *session // most recently used
	tail     *session
	n        int
}

type session struct {
	id         string
	prefixes   []prefixKey // ring of the most recent prefixes
	next       int         // ring write position once full
	expires    time.Time
	prev, succ *session
}

// NewSessions returns an empty registry. Production values are 1000
// sessions, 6h and time.Now; non-positive values fall back to them, and a nil
// now to time.Now.
func NewSessions(maxSessions int, ttl time.Duration, now func() time.Time) *Sessions {
	if maxSessions <= 0 {
		maxSessions = 1000
	}
	if ttl <= 0 {
		ttl = 6 * time.Hour
	}
	if now == nil {
		now = time.Now
	}
	return &Sessions{max: maxSessions, ttl: ttl, now: now, byPrefix: make(map[prefixKey]*session)}
}

// Len returns the number of live sessions (expired ones may linger until the
// next ID call).
func (s *Sessions) Len() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.n
}

// hashState is per-call scratch, pooled so ID does not allocate per message.
type hashState struct {
	canon    []byte
	text     []byte
	prefixes []prefixKey
}

var hashPool = sync.Pool{New: func() any { return new(hashState) }}

// ID returns the session id for a final outgoing body (after patches) and
// records the body's history under it.
func (s *Sessions) ID(body []byte) string {
	hs := hashPool.Get().(*hashState)
	defer putHashState(hs)
	hs.prefixes = historyPrefixes(body, hs)
	if len(hs.prefixes) == 0 {
		return bodyID(body)
	}
	return s.record(hs.prefixes, "")
}

// putHashState returns hs to the pool, unless one huge history would pin its
// buffers there.
func putHashState(hs *hashState) {
	if cap(hs.canon) > 64<<10 || cap(hs.text) > 64<<10 || cap(hs.prefixes) > 4096 {
		return
	}
	hashPool.Put(hs)
}

// bodyID names a body without messages: its own hash, unrecorded.
func bodyID(body []byte) string {
	sum := sha256.Sum256(body)
	return hex.EncodeToString(sum[:16])
}

// History is a body's hashed history, for a registry kept elsewhere (the
// shared one in Redis): the registry there picks the id from Keys and
// Candidate, and Record keeps this one in step so it can stand in when the
// other is unreachable (Resolve).
type History struct {
	prefixes []prefixKey // oldest first
	// Candidate is the id a new session would get: the hash of the whole
	// history, or for a body without messages the hash of the body.
	Candidate string
}

// NewHistory hashes body's messages as ID does, without touching a registry.
func NewHistory(body []byte) History {
	hs := hashPool.Get().(*hashState)
	defer putHashState(hs)
	hs.prefixes = historyPrefixes(body, hs)
	if len(hs.prefixes) == 0 {
		return History{Candidate: bodyID(body)}
	}
	last := hs.prefixes[len(hs.prefixes)-1]
	return History{prefixes: append([]prefixKey(nil), hs.prefixes...), Candidate: hex.EncodeToString(last[:])}
}

// Empty reports a body without messages: its Candidate is its id and there
// is nothing to look up or record.
func (h History) Empty() bool { return len(h.prefixes) == 0 }

// Keys appends the most recent prefix hashes (at most 128, the cap of a
// session's memory), longest first, in hex, each after prefix.
func (h History) Keys(dst []string, prefix string) []string {
	for i := len(h.prefixes) - 1; i >= 0 && i >= len(h.prefixes)-maxPrefixesPerSession; i-- {
		dst = append(dst, prefix+hex.EncodeToString(h.prefixes[i][:]))
	}
	return dst
}

// Resolve is ID for a history already hashed.
func (s *Sessions) Resolve(h History) string {
	if h.Empty() {
		return h.Candidate
	}
	return s.record(h.prefixes, "")
}

// Record remembers h's history under id, chosen elsewhere: every prefix of
// it names id from now on, so that Resolve gives the same answer while the
// other registry is unreachable.
func (s *Sessions) Record(h History, id string) {
	if h.Empty() || id == "" {
		return
	}
	s.record(h.prefixes, id)
}

// record finds or starts the session of prefixes and records them under it.
// With chosen "", the longest known prefix names the session (else a new
// one, named by the whole history); prefixes already recorded under another
// session stay there. With an id chosen elsewhere, the session is that id's
// and every prefix moves to it.
func (s *Sessions) record(prefixes []prefixKey, chosen string) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.now()
	for s.tail != nil && !now.Before(s.tail.expires) {
		s.remove(s.tail)
	}
	var sess *session
	for i := len(prefixes) - 1; i >= 0 && sess == nil; i-- {
		sess = s.byPrefix[prefixes[i]]
	}
	if sess == nil || (chosen != "" && sess.id != chosen) {
		id := chosen
		if id == "" {
			last := prefixes[len(prefixes)-1]
			id = hex.EncodeToString(last[:])
		}
		sess = &session{id: id}
		s.pushFront(sess)
		s.n++
		if s.n > s.max {
			s.remove(s.tail)
		}
	} else if s.head != sess {
		s.unlink(sess)
		s.pushFront(sess)
	}
	sess.expires = now.Add(s.ttl)
	from := len(prefixes) - maxPrefixesPerSession
	if from < 0 {
		from = 0
	}
	for _, p := range prefixes[from:] {
		if cur, ok := s.byPrefix[p]; !ok || (chosen != "" && cur != sess) {
			s.byPrefix[p] = sess
			s.addPrefix(sess, p)
		}
	}
	return sess.id
}

// addPrefix remembers p for sess, forgetting its oldest prefix when full.
func (s *Sessions) addPrefix(sess *session, p prefixKey) {
	if len(sess.prefixes) < maxPrefixesPerSession {
		sess.prefixes = append(sess.prefixes, p)
		return
	}
	old := sess.prefixes[sess.next]
	if s.byPrefix[old] == sess {
		delete(s.byPrefix, old)
	}
	sess.prefixes[sess.next] = p
	sess.next = (sess.next + 1) % maxPrefixesPerSession
}

// remove evicts sess and its prefixes.
func (s *Sessions) remove(sess *session) {
	for _, p := range sess.prefixes {
		if s.byPrefix[p] == sess {
			delete(s.byPrefix, p)
		}
	}
	s.unlink(sess)
	s.n--
}

func (s *Sessions) unlink(sess *session) {
	if sess.prev != nil {
		sess.prev.succ = sess.succ
	} else {
		s.head = sess.succ
	}
	if sess.succ != nil {
		sess.succ.prev = sess.prev
	} else {
		s.tail = sess.prev
	}
	sess.prev, sess.succ = nil, nil
}

func (s *Sessions) pushFront(sess *session) {
	sess.succ = s.head
	if s.head != nil {
		s.head.prev = sess
	}
	s.head = sess
	if s.tail == nil {
		s.tail = sess
	}
}

// sessionSeed starts every chain, so ids are specific to this scheme.
var sessionSeed = sha256.Sum256([]byte("llm_route session v1"))

// historyPrefixes computes the prefix hash chain of body's messages into
// hs.prefixes (reused). It returns nil when there are no messages.
func historyPrefixes(body []byte, hs *hashState) []prefixKey {
	out := hs.prefixes[:0]
	i := jsonscan.SkipWS(body, 0)
	if i >= len(body) || body[i] != '{' {
		return out
	}
	it := jsonscan.IterObject(body, i, false)
	var m, msgs jsonscan.Member
	msgs.Vs = -1
	for it.Next(&m) {
		if jsonscan.KeyIs(body, &m, "messages") {
			msgs = m
		}
	}
	if !it.OK() || msgs.Vs < 0 || body[msgs.Vs] != '[' {
		return out
	}
	// Where to start: the first user message, or the first message if none.
	start := -1
	ai := jsonscan.IterArray(body, msgs.Vs, false)
	for {
		vs, _, more := ai.Next()
		if !more {
			break
		}
		if start < 0 {
			start = vs
		}
		if isUser(body, vs) {
			start = vs
			break
		}
	}
	if start < 0 {
		return out
	}
	// One SHA-256 per message over the previous link and the message's
	// canonical form: Pk = H(Pk-1 ‖ canon(mk)), P0 = the seed.
	chain := sessionSeed
	ai = jsonscan.ResumeArray(body, start, false)
	for {
		vs, ve, more := ai.Next()
		if !more {
			break
		}
		hs.canon = append(hs.canon[:0], chain[:]...)
		hs.canon = canonMessage(hs.canon, body[vs:ve], hs)
		chain = sha256.Sum256(hs.canon)
		var k prefixKey
		copy(k[:], chain[:])
		out = append(out, k)
	}
	return out
}

// isUser reports whether the element at b[vs] is an object with role "user".
func isUser(b []byte, vs int) bool {
	if b[vs] != '{' {
		return false
	}
	it := jsonscan.IterObject(b, vs, false)
	var m jsonscan.Member
	user := false
	for it.Next(&m) {
		if jsonscan.KeyIs(b, &m, "role") {
			user = jsonscan.StrIs(b[m.Vs:m.Ve], true, "user")
		}
	}
	return user
}

// Record tags of the canonical form.
const (
	recRole     = 'r'
	recContent  = 'c'
	recPart     = 'p'
	recName     = 'n'
	recCallID   = 'i'
	recToolID   = 'T'
	recToolName = 'f'
	recToolArgs = 'a'
	recOther    = 'x'
)

func appendRec(dst []byte, tag byte, data []byte) []byte {
	dst = append(dst, tag)
	dst = binary.AppendUvarint(dst, uint64(len(data)))
	return append(dst, data...)
}

// appendStrRec appends a record with the decoded value of a JSON string; it
// does nothing for non-strings.
func appendStrRec(dst []byte, tag byte, v []byte, hs *hashState) []byte {
	if len(v) < 2 || v[0] != '"' {
		return dst
	}
	hs.text = jsonscan.AppendUnescape(hs.text[:0], v[1:len(v)-1])
	return appendRec(dst, tag, hs.text)
}

// canonMessage appends the canonical form of one message (see Sessions).
func canonMessage(dst, msg []byte, hs *hashState) []byte {
	if len(msg) == 0 || msg[0] != '{' {
		return appendRec(dst, recOther, canonJSON(nil, msg))
	}
	it := jsonscan.IterObject(msg, 0, false)
	var m, role, content, name, callID, calls jsonscan.Member
	role.Vs, content.Vs, name.Vs, callID.Vs, calls.Vs = -1, -1, -1, -1, -1
	for it.Next(&m) {
		switch {
		case jsonscan.KeyIs(msg, &m, "role"):
			role = m
		case jsonscan.KeyIs(msg, &m, "content"):
			content = m
		case jsonscan.KeyIs(msg, &m, "name"):
			name = m
		case jsonscan.KeyIs(msg, &m, "tool_call_id"):
			callID = m
		case jsonscan.KeyIs(msg, &m, "tool_calls"):
			calls = m
		}
	}
	if role.Vs >= 0 {
		dst = appendStrRec(dst, recRole, msg[role.Vs:role.Ve], hs)
	}
	if content.Vs >= 0 {
		dst = canonContent(dst, msg[content.Vs:content.Ve], hs)
	}
	if name.Vs >= 0 {
		dst = appendStrRec(dst, recName, msg[name.Vs:name.Ve], hs)
	}
	if callID.Vs >= 0 {
		dst = appendStrRec(dst, recCallID, msg[callID.Vs:callID.Ve], hs)
	}
	if calls.Vs >= 0 && msg[calls.Vs] == '[' {
		ai := jsonscan.IterArray(msg, calls.Vs, false)
		for {
			vs, ve, more := ai.Next()
			if !more {
				break
			}
			dst = canonToolCall(dst, msg[vs:ve], hs)
		}
	}
	return dst
}

// canonContent writes the content record: the trimmed concatenated text, and
// one record per non-text part.
func canonContent(dst, v []byte, hs *hashState) []byte {
	text := hs.text[:0]
	switch v[0] {
	case '"':
		text = jsonscan.AppendUnescape(text, v[1:len(v)-1])
	case '[':
		ai := jsonscan.IterArray(v, 0, false)
		for {
			vs, ve, more := ai.Next()
			if !more {
				break
			}
			part := v[vs:ve]
			if part[0] == '"' {
				text = jsonscan.AppendUnescape(text, part[1:len(part)-1])
				continue
			}
			if t, ok := textPart(part); ok {
				text = jsonscan.AppendUnescape(text, t)
				continue
			}
			dst = appendRec(dst, recPart, canonJSON(nil, part))
		}
	}
	hs.text = text
	if t := bytes.TrimFunc(text, unicode.IsSpace); len(t) > 0 {
		dst = appendRec(dst, recContent, t)
	}
	return dst
}

// textPart returns the raw interior of a text part's text: an object with a
// string "text" and a "type" that is absent or one of the text types.
func textPart(part []byte) ([]byte, bool) {
	if part[0] != '{' {
		return nil, false
	}
	typ, text, _ := jsonscan.TwoMembers(part, 0, "type", "text")
	if text.Vs < 0 || part[text.Vs] != '"' {
		return nil, false
	}
	if typ.Vs >= 0 {
		t := part[typ.Vs:typ.Ve]
		if !jsonscan.StrIs(t, true, "text") && !jsonscan.StrIs(t, true, "input_text") && !jsonscan.StrIs(t, true, "output_text") {
			return nil, false
		}
	}
	return part[text.Vs+1 : text.Ve-1], true
}

func canonToolCall(dst, call []byte, hs *hashState) []byte {
	if call[0] != '{' {
		return appendRec(dst, recOther, canonJSON(nil, call))
	}
	id, fn, _ := jsonscan.TwoMembers(call, 0, "id", "function")
	if id.Vs >= 0 {
		dst = appendStrRec(dst, recToolID, call[id.Vs:id.Ve], hs)
	}
	if fn.Vs >= 0 && call[fn.Vs] == '{' {
		name, args, _ := jsonscan.TwoMembers(call, fn.Vs, "name", "arguments")
		if name.Vs >= 0 {
			dst = appendStrRec(dst, recToolName, call[name.Vs:name.Ve], hs)
		}
		if args.Vs >= 0 {
			dst = appendStrRec(dst, recToolArgs, call[args.Vs:args.Ve], hs)
		}
	}
	return dst
}

// canonJSON appends a canonical encoding of any JSON value: object keys sorted
// (cache_control dropped), strings decoded, no white space. It is only used on
// rare shapes (non-text content parts), so it may allocate.
func canonJSON(dst, v []byte) []byte {
	if len(v) == 0 {
		return dst
	}
	switch v[0] {
	case '{':
		type kv struct {
			k []byte
			v []byte
		}
		var kvs []kv
		it := jsonscan.IterObject(v, 0, false)
		var m jsonscan.Member
		for it.Next(&m) {
			k := jsonscan.AppendUnescape(nil, v[m.Ks:m.Ke])
			if string(k) == "cache_control" {
				continue
			}
			kvs = append(kvs, kv{k, v[m.Vs:m.Ve]})
		}
		sort.SliceStable(kvs, func(i, j int) bool { return bytes.Compare(kvs[i].k, kvs[j].k) < 0 })
		dst = append(dst, '{')
		for _, e := range kvs {
			dst = appendRec(dst, 'k', e.k)
			dst = canonJSON(dst, e.v)
		}
		return append(dst, '}')
	case '[':
		dst = append(dst, '[')
		ai := jsonscan.IterArray(v, 0, false)
		for {
			vs, ve, more := ai.Next()
			if !more {
				break
			}
			dst = canonJSON(dst, v[vs:ve])
		}
		return append(dst, ']')
	case '"':
		s := jsonscan.AppendUnescape(nil, v[1:len(v)-1])
		if !utf8.Valid(s) {
			s = bytes.ToValidUTF8(s, []byte("\uFFFD"))
		}
		return appendRec(dst, 's', s)
	default:
		return appendRec(dst, 'v', v)
	}
}

// ValidHeaderValue reports whether s can be sent as a header value, as a
// session id or a key is: no control characters (CR and LF above all)
// other than horizontal tab.
func ValidHeaderValue(s string) bool {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < ' ' && c != '\t' || c == 0x7f {
			return false
		}
	}
	return true
}

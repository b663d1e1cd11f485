package console

import (
	"container/list"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"sync"
	"time"

	"github.com/sandboxd/sandboxd/internal/auth"
)

// session is a signed-in browser: the API key it signed in with (kept here, never sent
// back), who that key is, and the CSRF token its writes must carry.
type session struct {
	key     string
	who     auth.Principal
	csrf    string
	created time.Time
	seen    time.Time
	elem    *list.Element // in sessions.lru, most recently used first
	hash    [32]byte
}

// sessions is the bounded session table. It is keyed by the SHA-256 of the session ID,
// so that neither the map nor its lookups hold or compare the secret itself. One key
// holds at most MaxSessionsPerKey sessions (its least recently used goes first), so that
// one key cannot push everyone else's out; when the table is full, a new session evicts
// the expired ones, then the least recently used.
type sessions struct {
	mu       sync.Mutex
	byHash   map[[32]byte]*session
	lru      *list.List
	max      int
	idle     time.Duration
	absolute time.Duration
	now      func() time.Time
}

// MaxSessionsPerKey bounds the sessions of one API key.
const MaxSessionsPerKey = 16

func newSessions(max int, idle, absolute time.Duration, now func() time.Time) *sessions {
	return &sessions{byHash: map[[32]byte]*session{}, lru: list.New(), max: max, idle: idle, absolute: absolute, now: now}
}

// randomToken is 256 random bits, base64url without padding (43 characters).
func randomToken() string {
	var b [32]byte
	_, _ = rand.Read(b[:]) // never fails (crypto/rand, Go ≥ 1.24)
	return base64.RawURLEncoding.EncodeToString(b[:])
}

// create starts a session for key (of who) and returns its ID.
func (s *sessions) create(key string, who auth.Principal) (string, *session) {
	id := randomToken()
	now := s.now()
	ss := &session{key: key, who: who, csrf: randomToken(), created: now, seen: now, hash: sha256.Sum256([]byte(id))}
	s.mu.Lock()
	defer s.mu.Unlock()
	var mine []*session // this key's, most recently used first
	for e := s.lru.Front(); e != nil; e = e.Next() {
		if o := e.Value.(*session); o.who.KeyID == who.KeyID {
			mine = append(mine, o)
		}
	}
	for i := len(mine) - 1; i >= MaxSessionsPerKey-1; i-- {
		s.dropLocked(mine[i])
	}
	if len(s.byHash) >= s.max {
		for e := s.lru.Back(); e != nil; {
			prev := e.Prev()
			if o := e.Value.(*session); s.expired(o, now) {
				s.dropLocked(o)
			}
			e = prev
		}
	}
	for len(s.byHash) >= s.max {
		s.dropLocked(s.lru.Back().Value.(*session))
	}
	ss.elem = s.lru.PushFront(ss)
	s.byHash[ss.hash] = ss
	return id, ss
}

func (s *sessions) expired(ss *session, now time.Time) bool {
	return now.Sub(ss.seen) >= s.idle || now.Sub(ss.created) >= s.absolute
}

// get returns the live session of id and marks it used, or nil (unknown or expired,
// which it drops).
func (s *sessions) get(id string) *session {
	if id == "" || len(id) > 64 {
		return nil
	}
	h := sha256.Sum256([]byte(id))
	now := s.now()
	s.mu.Lock()
	defer s.mu.Unlock()
	ss := s.byHash[h]
	if ss == nil {
		return nil
	}
	if s.expired(ss, now) {
		s.dropLocked(ss)
		return nil
	}
	ss.seen = now
	s.lru.MoveToFront(ss.elem)
	return ss
}

func (s *sessions) drop(ss *session) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.byHash[ss.hash] == ss {
		s.dropLocked(ss)
	}
}

func (s *sessions) dropLocked(ss *session) {
	delete(s.byHash, ss.hash)
	s.lru.Remove(ss.elem)
}

func (s *sessions) len() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.byHash)
}

package sessions

import "sync"

// broadcaster wakes whoever follows a session (events --follow,
// wait_for_turn) when something about it changes. The followers then read
// the store: a wake-up carries no data, so a slow follower never blocks a
// turn and a missed wake-up is impossible while subscribed.
type broadcaster struct {
	mu   sync.Mutex
	subs map[string]map[chan struct{}]struct{}
}

func newBroadcaster() *broadcaster {
	return &broadcaster{subs: map[string]map[chan struct{}]struct{}{}}
}

// subscribe returns a channel that receives after every publish for name,
// and a function to stop.
func (b *broadcaster) subscribe(name string) (<-chan struct{}, func()) {
	ch := make(chan struct{}, 1)
	b.mu.Lock()
	if b.subs[name] == nil {
		b.subs[name] = map[chan struct{}]struct{}{}
	}
	b.subs[name][ch] = struct{}{}
	b.mu.Unlock()
	return ch, func() {
		b.mu.Lock()
		delete(b.subs[name], ch)
		if len(b.subs[name]) == 0 {
			delete(b.subs, name)
		}
		b.mu.Unlock()
	}
}

func (b *broadcaster) publish(name string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	for ch := range b.subs[name] {
		select {
		case ch <- struct{}{}:
		default: // already pending
		}
	}
}

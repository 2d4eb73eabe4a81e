package destroyhook_test

import (
	"context"
	"testing"
	"time"

	"github.com/hangar-dev/hangar/platform/fault"
	"github.com/hangar-dev/hangar/sandbox-svc/internal/destroyhook"
)

func TestNotifyWaitsForEveryAck(t *testing.T) {
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	h := destroyhook.NewHub(func() time.Time { return now }, time.Minute)
	a, cancelA := h.Subscribe("session-svc")
	defer cancelA()
	b, cancelB := h.Subscribe("replay-svc")
	defer cancelB()
	done := make(chan bool)
	go func() {
		_, ok := h.Notify(context.Background(), destroyhook.Notice{SandboxID: "sb-1", Reason: destroyhook.ReasonRelease})
		done <- ok
	}()
	na := <-a
	nb := <-b
	if na.ID != nb.ID || na.SandboxID != "sb-1" || !na.Deadline.Equal(now.Add(time.Minute)) {
		t.Errorf("notices %+v %+v", na, nb)
	}
	if err := h.Ack(na.ID, "session-svc"); err != nil {
		t.Fatal(err)
	}
	select {
	case <-done:
		t.Fatal("Notify returned before every subscriber acked")
	default:
	}
	if err := h.Ack(na.ID, "nobody"); !fault.Is(err, fault.KindNotFound) {
		t.Errorf("ack by unknown subscriber: %v", err)
	}
	if err := h.Ack(nb.ID, "replay-svc"); err != nil {
		t.Fatal(err)
	}
	if !<-done {
		t.Error("Notify reported a timeout")
	}
	if err := h.Ack(na.ID, "session-svc"); !fault.Is(err, fault.KindNotFound) {
		t.Errorf("ack of a finished notice: %v", err)
	}
}

func TestNotifyBounded(t *testing.T) {
	h := destroyhook.NewHub(nil, 20*time.Millisecond)
	ch, cancel := h.Subscribe("slow")
	defer cancel()
	_, ok := h.Notify(context.Background(), destroyhook.Notice{SandboxID: "sb"})
	if ok {
		t.Error("Notify without ack reported success")
	}
	<-ch
}

func TestSubscriberLeavingReleasesWait(t *testing.T) {
	h := destroyhook.NewHub(nil, time.Hour)
	ch, cancel := h.Subscribe("gone")
	done := make(chan bool)
	go func() {
		_, ok := h.Notify(context.Background(), destroyhook.Notice{SandboxID: "sb"})
		done <- ok
	}()
	<-ch
	cancel()
	<-done
}

func TestNoSubscribers(t *testing.T) {
	h := destroyhook.NewHub(nil, time.Hour)
	if _, ok := h.Notify(context.Background(), destroyhook.Notice{}); !ok {
		t.Error("no subscribers should not wait")
	}
}

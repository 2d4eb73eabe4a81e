package checkpoint

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"syscall"

	"github.com/hangar-dev/hangar/platform/fault"
)

// ReasonMissing: a restore named a checkpoint whose manifest is gone. The
// message names it and the session's checkpoints that can be restored.
const ReasonMissing = "CHECKPOINT_MISSING"

// maxRestorableNamed bounds how many restorable checkpoints an error names.
const maxRestorableNamed = 5

// notRestorable explains why checkpoint id cannot be restored (err is the
// fault reading its manifest gave: missing or damaged) and names what the
// session can be restored from instead. A restore never picks another
// checkpoint by itself: the caller asked for this one because its record
// names it, and an older one would silently lose work.
func (e *Engine) notRestorable(ctx context.Context, id string, err error) error {
	var fe *fault.Error
	if !errors.As(err, &fe) {
		return err
	}
	session, _, idErr := manifestKey(id)
	if idErr != nil {
		return err
	}
	var what string
	switch {
	case fe.Kind == fault.KindNotFound:
		what = fmt.Sprintf("checkpoint %s of session %s is missing (its manifest was deleted or never written); nothing was restored", id, session)
	case fe.Reason == ReasonTampered || fe.Reason == ReasonUnknownKey:
		what = fe.Message + "; nothing was restored"
	default:
		return err
	}
	restorable, lerr := e.restorable(ctx, session)
	if lerr != nil {
		e.opt.Logger.LogAttrs(ctx, slog.LevelWarn, "listing restorable checkpoints failed",
			slog.String("session", session), slog.Any("error", lerr))
		what += "; the session's other checkpoints could not be listed"
	} else if len(restorable) == 0 {
		what += fmt.Sprintf("; session %s has no other checkpoint that can be restored", session)
	} else {
		what += fmt.Sprintf("; session %s can be restored from: %s", session, strings.Join(restorable, ", "))
	}
	if fe.Kind == fault.KindNotFound {
		return fault.Wrap(fault.KindNotFound, ReasonMissing, what, err)
	}
	return fault.Wrap(fe.Kind, fe.Reason, what, err)
}

// restorable lists a session's checkpoints whose manifests read, newest
// first, as "ID (turn N, TIME)", at most maxRestorableNamed.
func (e *Engine) restorable(ctx context.Context, session string) ([]string, error) {
	keys, err := e.sessionKeys(ctx, session)
	if err != nil {
		return nil, err
	}
	var out []string
	for _, k := range keys {
		cp, err := e.listEntry(ctx, k)
		if err != nil {
			return nil, err
		}
		if cp == nil || cp.GetDamaged() != "" {
			continue
		}
		out = append(out, fmt.Sprintf("%s (turn %d, %s)", cp.GetId(), cp.GetTurn(), cp.GetCreatedAt().AsTime().UTC().Format("2006-01-02 15:04:05 UTC")))
		if len(out) == maxRestorableNamed {
			break
		}
	}
	return out, nil
}

// noSpaceText is how a command in a sandbox says its disk is full.
const noSpaceText = "No space left on device"

// captureFailed is the error of a failed capture. Its manifest was never
// written, so the session's newest checkpoint is still the previous one and
// nothing half-written is listed. When the disk is full it says so
// (fault.NoSpace) and collects at once: the chunks the capture stored
// before it failed are referenced by no manifest, and on a full disk their
// space is wanted now, not at the next collection.
func (e *Engine) captureFailed(ctx context.Context, session string, err error) error {
	if !errors.Is(err, syscall.ENOSPC) && !strings.Contains(err.Error(), noSpaceText) {
		return err
	}
	e.opt.Logger.LogAttrs(ctx, slog.LevelError, "capture failed: no space left",
		slog.String("session", session), slog.Any("error", err))
	e.collectLater(context.WithoutCancel(ctx))
	return fault.NoSpace(err)
}

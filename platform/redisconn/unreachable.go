package redisconn

import (
	"errors"
	"io"
	"net"
	"syscall"

	"github.com/redis/go-redis/v9"
)

// Unreachable reports whether err says Redis could not serve the call at
// all (no connection, connection lost, pool exhausted, server loading or
// read-only after a restart or failover), as opposed to an error about
// what was asked (a script's error, a wrong type, a bug). Only the first
// kind is "the store is unavailable, try again"; the second is an internal
// error and must not be reported as an outage.
func Unreachable(err error) bool {
	if err == nil {
		return false
	}
	var netErr net.Error
	var opErr *net.OpError
	switch {
	case errors.As(err, &opErr), errors.As(err, &netErr),
		errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF),
		errors.Is(err, redis.ErrClosed), errors.Is(err, redis.ErrPoolTimeout), errors.Is(err, redis.ErrPoolExhausted),
		errors.Is(err, syscall.ECONNREFUSED), errors.Is(err, syscall.ECONNRESET), errors.Is(err, syscall.EPIPE):
		return true
	}
	return redis.IsLoadingError(err) || redis.IsReadOnlyError(err) || redis.IsMasterDownError(err) ||
		redis.IsMaxClientsError(err) || redis.IsTryAgainError(err) || redis.IsClusterDownError(err)
}

package store

import (
	"errors"
	"fmt"
	"syscall"

	"github.com/jackc/pgx/v5/pgconn"
	"modernc.org/sqlite"
)

// sqliteFull is SQLITE_FULL, the primary result code of a write that found
// the disk full (the low byte of an extended code).
const sqliteFull = 13

// pgDiskFull is PostgreSQL's SQLSTATE disk_full.
const pgDiskFull = "53100"

// diskFull marks a database error that says the disk is full with
// syscall.ENOSPC, so the RPC edge answers "no space left on the data
// volume" (fault.ReasonNoSpace) rather than an internal error.
func diskFull(err error) error {
	var se *sqlite.Error
	var pe *pgconn.PgError
	if (errors.As(err, &se) && se.Code()&0xff == sqliteFull) || (errors.As(err, &pe) && pe.Code == pgDiskFull) {
		return fmt.Errorf("%w (%w)", err, syscall.ENOSPC)
	}
	return err
}

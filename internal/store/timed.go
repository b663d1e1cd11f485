package store

import (
	"context"
	"time"

	"github.com/sandboxd/sandboxd/internal/metrics/counters"
)

// timedDB records how long each statement and transaction of d takes
// (cwsandbox_store_operation_duration_seconds by op: exec, query, query_row, tx). A
// query's time is until its first answer, not its rows' iteration; statements inside a
// transaction count in its tx only.
type timedDB struct{ db }

func (t timedDB) exec(ctx context.Context, q string, args ...any) (int64, error) {
	start := time.Now()
	n, err := t.db.exec(ctx, q, args...)
	counters.StoreOp(counters.StoreExec, time.Since(start))
	return n, err
}

func (t timedDB) query(ctx context.Context, q string, args ...any) (rows, error) {
	start := time.Now()
	r, err := t.db.query(ctx, q, args...)
	counters.StoreOp(counters.StoreQuery, time.Since(start))
	return r, err
}

func (t timedDB) queryRow(ctx context.Context, q string, args ...any) row {
	start := time.Now()
	r := t.db.queryRow(ctx, q, args...)
	counters.StoreOp(counters.StoreQueryRow, time.Since(start))
	return r
}

func (t timedDB) tx(ctx context.Context, fn func(q querier) error) error {
	start := time.Now()
	err := t.db.tx(ctx, fn)
	counters.StoreOp(counters.StoreTx, time.Since(start))
	return err
}

package store

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
)

// Identity is the store's persistent identity: 32 random bytes (hex), created by the
// first caller and the same for every process that opens this database from then on
// (table store_identity, one row). Two databases never share one, except a copy of one
// (a restored backup) which is the same store as far as this ID goes. It is not a
// secret credential, but nothing hands it out: a control plane proves it knows it
// (controlplane.StoreProof) so that a gateway can check they share one store.
func (s *sqlStore) Identity(ctx context.Context) (string, error) {
	read := func() (string, error) {
		var id string
		err := s.d.queryRow(ctx, `SELECT id FROM store_identity WHERE singleton = 1`).Scan(&id)
		return id, err
	}
	id, err := read()
	if err == nil {
		return id, nil
	}
	if !s.d.isNoRows(err) {
		return "", fmt.Errorf("read store identity: %w", err)
	}
	b := make([]byte, 32)
	_, _ = rand.Read(b) // never fails (crypto/rand)
	// Concurrent first callers (a gateway and a control plane starting together): one
	// insert wins, every caller then reads the winner's.
	if _, err := s.d.exec(ctx, `INSERT INTO store_identity (singleton, id) VALUES (1, $1) ON CONFLICT (singleton) DO NOTHING`, hex.EncodeToString(b)); err != nil {
		return "", fmt.Errorf("create store identity: %w", err)
	}
	if id, err = read(); err != nil {
		return "", fmt.Errorf("read store identity: %w", err)
	}
	return id, nil
}

package gcsstore

import (
	"context"
	"fmt"

	"cloud.google.com/go/storage"
)

// Open opens url (gs://bucket[/prefix]) with the default credentials
// (workload identity on GKE); close releases the client.
func Open(ctx context.Context, url string) (store *Store, close func() error, err error) {
	if _, _, err := ParseURL(url); err != nil {
		return nil, nil, err
	}
	client, err := storage.NewClient(ctx)
	if err != nil {
		return nil, nil, fmt.Errorf("cannot create a GCS client: %w", err)
	}
	store, err = New(client, url)
	if err != nil {
		_ = client.Close()
		return nil, nil, err
	}
	return store, client.Close, nil
}

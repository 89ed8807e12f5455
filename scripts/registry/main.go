// A Confluent-compatible schema registry for lambda-streams' local tests: Conduit's
// schema registry (github.com/conduitio/conduit-schema-registry, Apache-2.0), in memory,
// served on one address. scripts/services builds and starts it; see the comment there for
// why this registry.
package main

import (
	"flag"
	"log"
	"log/slog"
	"net/http"
	"os"

	"github.com/conduitio/conduit-commons/database/inmemory"
	schemaregistry "github.com/conduitio/conduit-schema-registry"
)

func main() {
	listen := flag.String("listen", "127.0.0.1:8081", "address to serve the registry API on")
	flag.Parse()
	registry, err := schemaregistry.NewSchemaRegistry(&inmemory.DB{})
	if err != nil {
		log.Fatalf("schema registry: %v", err)
	}
	logger := slog.New(slog.NewTextHandler(os.Stderr, nil))
	mux := http.NewServeMux()
	schemaregistry.NewServer(logger, registry).RegisterHandlers(mux)
	logger.Info("schema registry listening", "address", *listen)
	log.Fatal(http.ListenAndServe(*listen, mux))
}

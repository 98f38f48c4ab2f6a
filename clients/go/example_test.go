package herald_test

import (
	"context"
	"fmt"
	"log"
	"time"

	herald "github.com/herald-rt/herald/clients/go"
)

// A client whose backend hands out short-lived tokens; the client asks again before expiry.
func ExampleNew() {
	client, err := herald.New("wss://rt.example.com/ws", herald.Options{
		TokenFunc: func(ctx context.Context) (string, error) {
			return "a JWT from your backend", nil
		},
		Handlers: herald.Handlers{
			OnConnecting: func(e herald.ConnectingEvent) {
				if e.Code != herald.CodeConnectCalled {
					log.Printf("connection lost (%d %s); reconnecting", e.Code, e.Reason)
				}
			},
			OnDisconnected: func(e herald.DisconnectedEvent) { log.Printf("stopped: %d %s", e.Code, e.Reason) },
		},
	})
	if err != nil {
		log.Fatal(err)
	}
	defer client.Close()
	client.Connect()
}

// Subscribing with recovery: store the position, resume from it after a restart.
func ExampleClient_Subscribe() {
	client, _ := herald.New("ws://127.0.0.1:8000/ws", herald.Options{})
	defer client.Close()
	client.Connect()

	var stored *herald.StreamPosition // e.g. loaded from your database
	sub, err := client.Subscribe("chat:room1", herald.SubscribeOptions{
		Since: stored,
		OnPublication: func(p herald.PublicationEvent) {
			fmt.Printf("%d: %s\n", p.Offset, p.Data)
		},
		OnRecoveryFailed: func(e herald.RecoveryFailedEvent) {
			// Some publications could not be recovered: reload the room from your own source.
		},
	})
	if err != nil {
		log.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := sub.Ready(ctx); err != nil {
		log.Print(err)
	}
	if pos, ok := sub.Position(); ok {
		_ = pos // store it to resume later
	}
}

// Quick start: connect to a node started with `herald serve --dev`, subscribe to "chat",
// publish to it, print what arrives.
package main

import (
	"context"
	"fmt"
	"log"
	"os"
	"time"

	herald "github.com/herald-rt/herald/clients/go"
)

func main() {
	url := "ws://127.0.0.1:8000/ws"
	if u := os.Getenv("HERALD_URL"); u != "" {
		url = u
	}
	received := make(chan herald.PublicationEvent, 16)

	client, err := herald.New(url, herald.Options{
		Handlers: herald.Handlers{
			OnConnected: func(e herald.ConnectedEvent) { fmt.Println("connected as", e.Client) },
			OnDisconnected: func(e herald.DisconnectedEvent) {
				log.Printf("disconnected for good: %d %s", e.Code, e.Reason)
			},
		},
	})
	if err != nil {
		log.Fatal(err)
	}
	defer client.Close()
	client.Connect() // returns at once; the client (re)connects on its own

	sub, err := client.Subscribe("chat", herald.SubscribeOptions{
		// Every publication once, in order; recovered after a reconnect.
		OnPublication: func(p herald.PublicationEvent) { received <- p },
	})
	if err != nil {
		log.Fatal(err)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := sub.Ready(ctx); err != nil {
		log.Fatal(err)
	}
	res, err := client.Publish(ctx, "chat", map[string]string{"text": "hello"})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("published at offset", res.Offset)

	select {
	case p := <-received:
		fmt.Printf("received %s at offset %d\n", p.Data, p.Offset)
	case <-ctx.Done():
		log.Fatal("nothing received")
	}
}

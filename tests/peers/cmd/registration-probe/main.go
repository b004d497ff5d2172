// Command registration-probe asks a plugin's registration socket who it is, dialling it the
// way kubelet's plugin watcher does: grpc-go with the bare socket path as the target (which
// makes that path the HTTP/2 :authority) and a unix dialer. It prints the PluginInfo as JSON,
// then reports a successful registration, and exits non-zero on any error.
package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"
)

func main() {
	if len(os.Args) != 2 {
		fmt.Fprintln(os.Stderr, "usage: registration-probe SOCKET")
		os.Exit(2)
	}
	socket := os.Args[1]
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	// DialContext (not NewClient) for its passthrough resolver: the target, a bare path,
	// becomes the :authority, as in kubelet 1.35's pluginmanager dial.
	//nolint:staticcheck // deprecated, and what kubelet calls
	conn, err := grpc.DialContext(ctx, socket,
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithBlock(),
		grpc.WithContextDialer(func(ctx context.Context, addr string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, "unix", addr)
		}),
	)
	if err != nil {
		fmt.Fprintf(os.Stderr, "dial %s: %v\n", socket, err)
		os.Exit(1)
	}
	defer conn.Close()
	client := registerapi.NewRegistrationClient(conn)
	info, err := client.GetInfo(ctx, &registerapi.InfoRequest{})
	if err != nil {
		fmt.Fprintf(os.Stderr, "GetInfo: %v\n", err)
		os.Exit(1)
	}
	if _, err := client.NotifyRegistrationStatus(ctx, &registerapi.RegistrationStatus{PluginRegistered: true}); err != nil {
		fmt.Fprintf(os.Stderr, "NotifyRegistrationStatus: %v\n", err)
		os.Exit(1)
	}
	out, _ := json.Marshal(info)
	fmt.Println(string(out))
}

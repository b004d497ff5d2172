// Command cri-pods stops and removes every pod sandbox a CRI runtime holds, through the CRI as
// kubelet does when it deletes a pod: StopPodSandbox runs the network plugin's DEL (the veth
// and the address go back) before RemovePodSandbox. The suites' node teardown calls it so that a
// pod left by a failed scenario is undone the way a cluster undoes it, not behind the runtime's
// back. It prints how many sandboxes it removed and exits non-zero on any error.
package main

import (
	"context"
	"fmt"
	"os"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

func main() {
	if len(os.Args) != 2 {
		fmt.Fprintln(os.Stderr, "usage: cri-pods SOCKET")
		os.Exit(2)
	}
	conn, err := grpc.NewClient("unix://"+os.Args[1], grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		fmt.Fprintf(os.Stderr, "dial %s: %v\n", os.Args[1], err)
		os.Exit(1)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	client := runtimeapi.NewRuntimeServiceClient(conn)
	listed, err := client.ListPodSandbox(ctx, &runtimeapi.ListPodSandboxRequest{})
	if err != nil {
		fmt.Fprintf(os.Stderr, "ListPodSandbox: %v\n", err)
		os.Exit(1)
	}
	failed := false
	for _, sandbox := range listed.Items {
		if _, err := client.StopPodSandbox(ctx, &runtimeapi.StopPodSandboxRequest{PodSandboxId: sandbox.Id}); err != nil {
			fmt.Fprintf(os.Stderr, "StopPodSandbox %s: %v\n", sandbox.Id, err)
			failed = true
			continue
		}
		if _, err := client.RemovePodSandbox(ctx, &runtimeapi.RemovePodSandboxRequest{PodSandboxId: sandbox.Id}); err != nil {
			fmt.Fprintf(os.Stderr, "RemovePodSandbox %s: %v\n", sandbox.Id, err)
			failed = true
		}
	}
	fmt.Printf("removed %d pod sandboxes\n", len(listed.Items))
	if failed {
		os.Exit(1)
	}
}

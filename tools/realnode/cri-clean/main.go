// Command cri-clean stops and removes every pod sandbox a CRI runtime holds,
// so the runtime tears down each pod's network (CNI DEL) and namespaces
// before scripts/realnode.sh stops it. No crictl is packaged here.
//
//	cri-clean unix:///path/to/containerd.sock
package main

import (
	"context"
	"fmt"
	"log"
	"os"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

func main() {
	log.SetFlags(0)
	log.SetPrefix("cri-clean: ")
	if len(os.Args) != 2 {
		log.Fatal("usage: cri-clean unix:///path/to/socket")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	conn, err := grpc.NewClient(os.Args[1], grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		log.Fatal(err)
	}
	defer conn.Close()
	rt := runtimeapi.NewRuntimeServiceClient(conn)
	list, err := rt.ListPodSandbox(ctx, &runtimeapi.ListPodSandboxRequest{})
	if err != nil {
		log.Fatal(err)
	}
	failed := 0
	for _, p := range list.GetItems() {
		if _, err := rt.StopPodSandbox(ctx, &runtimeapi.StopPodSandboxRequest{PodSandboxId: p.GetId()}); err != nil {
			log.Printf("stop %s/%s: %v", p.GetMetadata().GetNamespace(), p.GetMetadata().GetName(), err)
			failed++
			continue
		}
		if _, err := rt.RemovePodSandbox(ctx, &runtimeapi.RemovePodSandboxRequest{PodSandboxId: p.GetId()}); err != nil {
			log.Printf("remove %s/%s: %v", p.GetMetadata().GetNamespace(), p.GetMetadata().GetName(), err)
			failed++
		}
	}
	fmt.Printf("cri-clean: removed %d of %d pod sandboxes\n", len(list.GetItems())-failed, len(list.GetItems()))
	if failed > 0 {
		os.Exit(1)
	}
}

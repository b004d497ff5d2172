// Command e2e-provider is a Secrets Store CSI Driver provider for the end-to-end suites: the
// provider API (v1alpha1.CSIDriverProvider) compiled from the upstream driver's own module and
// served by grpc-go on a unix socket, as every real provider (Vault, AWS, Azure, GCP) serves it.
// It stands in for upstream's test/e2eprovider, whose module the proxy here does not serve, and
// keeps its contract: the SecretProviderClass-style `objects` parameter names what to mount.
//
// Each object's content is the file of that name under --objects; its version is the content's
// SHA-256 prefix. Every Mount is decoded as upstream's fake provider decodes it (attributes,
// secrets and permission as JSON) and logged, one JSON line to --log, without secret values: the
// pod's keys, the permission, the versions the driver sent back and the secret keys.
package main

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"flag"
	"fmt"
	"log"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"syscall"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"sigs.k8s.io/secrets-store-csi-driver/provider/v1alpha1"
	"sigs.k8s.io/yaml"
)

type provider struct {
	v1alpha1.UnimplementedCSIDriverProviderServer
	objects string
	logMu   sync.Mutex
	logFile *os.File
}

// The SecretProviderClass parameter shape: `array` of YAML documents, one object each.
type objectList struct {
	Array []string `json:"array"`
}

type object struct {
	ObjectName  string `json:"objectName"`
	ObjectAlias string `json:"objectAlias"`
}

type mountLog struct {
	Pod                  string            `json:"pod"`
	ServiceAccount       string            `json:"serviceAccount"`
	Permission           string            `json:"permission"`
	TargetPath           string            `json:"targetPath"`
	CurrentObjectVersion map[string]string `json:"currentObjectVersion"`
	SecretKeys           []string          `json:"secretKeys"`
	TokenAudiences       []string          `json:"tokenAudiences"`
	AttributeKeys        []string          `json:"attributeKeys"`
}

func (p *provider) Version(ctx context.Context, req *v1alpha1.VersionRequest) (*v1alpha1.VersionResponse, error) {
	return &v1alpha1.VersionResponse{Version: "v1alpha1", RuntimeName: "inline-guard-e2e-provider", RuntimeVersion: "0.1.0"}, nil
}

func (p *provider) Mount(ctx context.Context, req *v1alpha1.MountRequest) (*v1alpha1.MountResponse, error) {
	var attributes, secrets map[string]string
	var permission os.FileMode
	if err := json.Unmarshal([]byte(req.GetAttributes()), &attributes); err != nil {
		return nil, status.Errorf(codes.InvalidArgument, "attributes: %v", err)
	}
	if err := json.Unmarshal([]byte(req.GetSecrets()), &secrets); err != nil {
		return nil, status.Errorf(codes.InvalidArgument, "secrets: %v", err)
	}
	if err := json.Unmarshal([]byte(req.GetPermission()), &permission); err != nil {
		return nil, status.Errorf(codes.InvalidArgument, "permission: %v", err)
	}
	if err := p.log(req, attributes, secrets); err != nil {
		return nil, status.Errorf(codes.Internal, "log: %v", err)
	}
	var list objectList
	if err := yaml.Unmarshal([]byte(attributes["objects"]), &list); err != nil || len(list.Array) == 0 {
		return nil, status.Errorf(codes.InvalidArgument, "objects: want a YAML `array` of objects (%v)", err)
	}
	response := &v1alpha1.MountResponse{}
	for _, doc := range list.Array {
		var o object
		if err := yaml.Unmarshal([]byte(doc), &o); err != nil || o.ObjectName == "" || strings.Contains(o.ObjectName, "/") {
			return nil, status.Errorf(codes.InvalidArgument, "objects: an object without a plain objectName (%v)", err)
		}
		contents, err := os.ReadFile(filepath.Join(p.objects, o.ObjectName))
		if err != nil {
			return nil, status.Errorf(codes.NotFound, "object %q: %v", o.ObjectName, err)
		}
		path := o.ObjectName
		if o.ObjectAlias != "" {
			path = o.ObjectAlias
		}
		sum := sha256.Sum256(contents)
		response.Files = append(response.Files, &v1alpha1.File{Path: path, Mode: int32(permission), Contents: contents})
		response.ObjectVersion = append(response.ObjectVersion, &v1alpha1.ObjectVersion{Id: "secret/" + o.ObjectName, Version: hex.EncodeToString(sum[:4])})
	}
	return response, nil
}

func (p *provider) log(req *v1alpha1.MountRequest, attributes, secrets map[string]string) error {
	entry := mountLog{
		Pod:                  attributes["csi.storage.k8s.io/pod.namespace"] + "/" + attributes["csi.storage.k8s.io/pod.name"],
		ServiceAccount:       attributes["csi.storage.k8s.io/serviceAccount.name"],
		Permission:           req.GetPermission(),
		TargetPath:           req.GetTargetPath(),
		CurrentObjectVersion: map[string]string{},
		SecretKeys:           keys(secrets),
		TokenAudiences:       []string{},
	}
	for _, v := range req.GetCurrentObjectVersion() {
		entry.CurrentObjectVersion[v.Id] = v.Version
	}
	if tokens := attributes["csi.storage.k8s.io/serviceAccount.tokens"]; tokens != "" {
		var byAudience map[string]json.RawMessage
		if err := json.Unmarshal([]byte(tokens), &byAudience); err != nil {
			return fmt.Errorf("serviceAccount.tokens is not kubelet's JSON: %w", err)
		}
		entry.TokenAudiences = keys(byAudience)
	}
	entry.AttributeKeys = keys(attributes)
	line, err := json.Marshal(entry)
	if err != nil {
		return err
	}
	p.logMu.Lock()
	defer p.logMu.Unlock()
	_, err = p.logFile.Write(append(line, '\n'))
	return err
}

func keys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

func main() {
	socket := flag.String("socket", "", "the unix socket to serve on")
	objects := flag.String("objects", "", "the directory whose files are the objects")
	logPath := flag.String("log", "", "where each Mount is logged, one JSON line")
	flag.Parse()
	if *socket == "" || *objects == "" || *logPath == "" {
		log.Fatal("--socket, --objects and --log are required")
	}
	logFile, err := os.OpenFile(*logPath, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o600)
	if err != nil {
		log.Fatal(err)
	}
	_ = os.Remove(*socket)
	listener, err := net.Listen("unix", *socket)
	if err != nil {
		log.Fatal(err)
	}
	server := grpc.NewServer()
	v1alpha1.RegisterCSIDriverProviderServer(server, &provider{objects: *objects, logFile: logFile})
	signals := make(chan os.Signal, 1)
	signal.Notify(signals, syscall.SIGTERM, syscall.SIGINT)
	go func() {
		<-signals
		server.GracefulStop()
	}()
	if err := server.Serve(listener); err != nil {
		log.Fatal(err)
	}
}

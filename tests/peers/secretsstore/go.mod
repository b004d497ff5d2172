module inlineguard.dev/tests/peers/secretsstore

go 1.26.0

require (
	google.golang.org/grpc v1.56.3
	sigs.k8s.io/secrets-store-csi-driver v1.5.4
	sigs.k8s.io/yaml v1.3.0
)

require (
	github.com/golang/protobuf v1.5.4 // indirect
	golang.org/x/net v0.38.0 // indirect
	golang.org/x/sys v0.31.0 // indirect
	golang.org/x/text v0.23.0 // indirect
	google.golang.org/genproto v0.0.0-20230410155749-daa745c078e1 // indirect
	google.golang.org/protobuf v1.33.0 // indirect
	gopkg.in/yaml.v2 v2.4.0 // indirect
)

from torchscale.cli.app import main

main()

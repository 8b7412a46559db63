from torchscale.worker.main import main

main()

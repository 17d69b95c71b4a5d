"""DDP ResNet-18 on synthetic images (fixed seeds), for comparing backends:

    migctl run --gpus 0 --np 7 -- python examples/pytorch/ddp_resnet.py --backend migctl --batch 32
    migctl run --gpus 0 --np 7 -- python examples/pytorch/ddp_resnet.py --backend gloo --batch 8
    migctl run --gpus 0 --np 7 -- python examples/pytorch/ddp_resnet.py --backend none   # the bound

Rank 0 prints one JSON line (steps/s of the slowest rank, losses of the
first steps, parameter checksum, whether all ranks agree)."""

import torch
import torch.nn as nn

import common


def resnet18(num_classes):
    try:
        import torchvision
        return torchvision.models.resnet18(num_classes=num_classes)
    except ImportError:
        return _ResNet18(num_classes)


class _Block(nn.Module):
    def __init__(self, cin, cout, stride):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.down = None
        if stride != 1 or cin != cout:
            self.down = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x):
        idt = x if self.down is None else self.down(x)
        y = torch.relu(self.bn1(self.conv1(x)))
        return torch.relu(self.bn2(self.conv2(y)) + idt)


class _ResNet18(nn.Module):
    """torchvision's ResNet-18 layout, for machines without torchvision."""

    def __init__(self, num_classes):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 64, 7, 2, 3, bias=False), nn.BatchNorm2d(64), nn.ReLU(),
                                  nn.MaxPool2d(3, 2, 1))
        layers, cin = [], 64
        for cout, stride in ((64, 1), (128, 2), (256, 2), (512, 2)):
            layers += [_Block(cin, cout, stride), _Block(cout, cout, 1)]
            cin = cout
        self.layers = nn.Sequential(*layers)
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(512, num_classes)

    def forward(self, x):
        x = self.layers(self.stem(x))
        return self.fc(torch.flatten(self.avgpool(x), 1))


def main():
    ap = common.parser(__doc__)
    ap.add_argument("--image-size", type=int, default=224)
    ap.add_argument("--classes", type=int, default=1000)
    ap.add_argument("--pool", type=int, default=4, help="distinct synthetic batches cycled through")
    args = ap.parse_args()
    rank, world, device = common.setup(args)
    torch.manual_seed(args.seed)  # the same initial weights on every rank (DDP broadcasts them anyway)
    model = resnet18(args.classes)
    if args.deterministic:
        model.avgpool = common.MeanPool()
    model = model.to(device)
    g = torch.Generator().manual_seed(args.seed + 1000 * rank + 1)
    batches = [(torch.randn(args.batch, 3, args.image_size, args.image_size, generator=g).to(device),
                torch.randint(0, args.classes, (args.batch,), generator=g).to(device)) for _ in range(args.pool)]
    model = common.wrap(model, args, device)
    n = sum(p.numel() for p in model.parameters())
    common.train("resnet18", args, model, batches, nn.functional.cross_entropy, rank, world, device,
                 extra={"params": n, "image_size": args.image_size})


if __name__ == "__main__":
    main()

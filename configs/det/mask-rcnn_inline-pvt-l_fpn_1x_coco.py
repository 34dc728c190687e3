# Mask R-CNN + FPN, InLine-PVT-L, 1x, COCO (recipe as InLine-PVT-T).
_base_ = './mask-rcnn_inline-pvt-t_fpn_1x_coco.py'

checkpoint = 'checkpoints/inline_pvt_l.pth'
model = dict(backbone=dict(arch='large', drop_path_rate=0.3,
                           init_cfg=dict(type='Pretrained', checkpoint=checkpoint)))

#include "pqNeighborGridAxisFlagsWidget.h"

#include "pqPropertiesPanel.h"

#include <QCheckBox>
#include <QHBoxLayout>

//-----------------------------------------------------------------------------
pqNeighborGridAxisFlagsWidget::pqNeighborGridAxisFlagsWidget(
  vtkSMProxy* proxy, vtkSMProperty* property, QWidget* parent)
  : Superclass(proxy, parent)
{
  auto* layout = new QHBoxLayout(this);
  layout->setContentsMargins(pqPropertiesPanel::suggestedMargins());
  layout->setSpacing(pqPropertiesPanel::suggestedHorizontalSpacing());
  const char* const axes[3] = { "x", "y", "z" };
  for (int axis = 0; axis < 3; ++axis)
  {
    auto* checkBox = new QCheckBox(axes[axis], this);
    checkBox->setObjectName(QString("CheckBox_") + axes[axis]);
    this->addPropertyLink(checkBox, "checked", SIGNAL(toggled(bool)), property, axis);
    layout->addWidget(checkBox);
  }
  layout->addStretch(1);
  // A check box has no editing in progress: every toggle is a finished change.
  this->setChangeAvailableAsChangeFinished(true);
}

//-----------------------------------------------------------------------------
pqNeighborGridAxisFlagsWidget::~pqNeighborGridAxisFlagsWidget() = default;
